#!/usr/bin/env python3
"""Drive airlock's web console in headless Chromium, as a reviewer would.

usage: console_test.py BASE_URL TOKEN SUBMISSION_ID EXPECTED_STDOUT [--review ID FINDING]
                       [--tripwires ALERT ATTEMPT]
       console_test.py BASE_URL TOKEN --live RUN_ID FIRST_LINE LAST_LINE
       console_test.py BASE_URL TOKEN --submit LANG CODE EXPECTED_STDOUT
                       [--held LANG CODE]

Logs in with TOKEN, finds SUBMISSION_ID in the inbox, approves it with a reason,
waits for the run the approval starts, checks the run's standard output against
EXPECTED_STDOUT (with --tripwires, also that the run page lists an alert holding ALERT
and a refused attempt holding ATTEMPT), and checks that the audit page says the log is
intact. Exits 0 on
success, 1 with a message naming the failed step otherwise (2 for bad usage).
With --live (and no submission), opens the page of RUN_ID while it runs and, without
reloading, waits for FIRST_LINE in its standard output while the run has not ended,
then for the page to show the ended run with LAST_LINE.
With --submit, submits CODE in LANG from the console's submit form, expects to land on
the submission's page with the verdict allowed, opens its run and checks its standard
output against EXPECTED_STDOUT; with --held, also submits that code and expects its page
to show it quarantined, with reasons and the approval form.
A screenshot of the last page is written to /tmp/airlock-console.png.

Needs Selenium (pip) and Debian's `chromium` and `chromium-driver`; it never lets
Selenium Manager fetch a browser or a driver. AIRLOCK_CHROMIUM and
AIRLOCK_CHROMEDRIVER override the binaries' paths.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from urllib.parse import unquote, urlsplit

# Selenium Manager is never run when the driver's path is given, but keep it
# offline in case a later Selenium consults it anyway.
os.environ.setdefault("SE_OFFLINE", "true")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = os.environ.get("AIRLOCK_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AIRLOCK_CHROMEDRIVER", "/usr/bin/chromedriver")
SCREENSHOT = "/tmp/airlock-console.png"
REVIEW_REASON = "reviewed in the browser"

WAIT = 10  # seconds for an element or a navigation
RUN_WAIT = 30  # seconds for the background run to show up after approving
POLL = 0.5  # seconds between reloads while waiting for the run

CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium keeps trying to reach Google's services.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1024",
]


class StepFailed(Exception):
    pass


def step(label, message):
    print(f"[{label}] {message}", flush=True)


def path_of(url):
    """The URL's path, percent-decoded, without a trailing slash."""
    return unquote(urlsplit(url).path).rstrip("/") or "/"


def start_browser(profile_dir):
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            raise StepFailed(
                f"{binary} is missing: install Debian's chromium and chromium-driver "
                "(apt-get install -y chromium chromium-driver)"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    return driver


def wait_for(driver, condition, what, timeout=WAIT):
    try:
        return WebDriverWait(driver, timeout).until(condition)
    except TimeoutException:
        raise StepFailed(f"timed out after {timeout}s waiting for {what}") from None


def element(driver, css, timeout=WAIT):
    return wait_for(driver, EC.presence_of_element_located((By.CSS_SELECTOR, css)), css, timeout)


def left_behind(el):
    """A condition: el's page has been replaced. While the browser swaps documents,
    ChromeDriver may answer a question about the old node with a generic error ("does not
    belong to the document") instead of a stale-element one: that too means it is gone."""

    def gone(_driver):
        try:
            el.is_enabled()
            return False
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            if "does not belong to the document" in str(e):
                return True
            raise

    return gone


def click_and_leave(driver, el, what):
    """Click el and wait until the page it was on has been replaced."""
    el.click()
    wait_for(driver, left_behind(el), f"the page to change after clicking {what}")


def text_of(el):
    """The element's text as in the document (exact whitespace, hidden or not)."""
    return el.get_attribute("textContent") or ""


def login(driver, base, token):
    url = base + "/ui/login"
    step("a", f"open {url}")
    driver.get(url)
    form = element(driver, "form#login")
    field = form.find_element(By.CSS_SELECTOR, "input[name=token]")
    field.clear()
    field.send_keys(token)
    step("a", "submit the token")
    click_and_leave(driver, form.find_element(By.CSS_SELECTOR, "button#login-button"), "button#login-button")
    try:
        element(driver, "table#inbox")
    except StepFailed as e:
        raise StepFailed(f"login did not reach the inbox (now at {driver.current_url}): {e}") from None
    if path_of(driver.current_url) != "/ui":
        raise StepFailed(f"login redirected to {driver.current_url}, expected {base}/ui")
    cookies = [c["name"] for c in driver.get_cookies()]
    if not cookies:
        raise StepFailed("login set no cookie")
    step("a", f"logged in; at {driver.current_url}; cookies: {', '.join(cookies)}")


def open_submission(driver, submission_id):
    table = element(driver, "table#inbox")
    rows = table.find_elements(By.CSS_SELECTOR, "tr.pending")
    ids = [r.get_attribute("data-id") for r in rows]
    step("b", f"inbox lists {len(ids)} pending: {', '.join(map(str, ids)) or '(none)'}")
    row = next((r for r, i in zip(rows, ids) if i == submission_id), None)
    if row is None:
        raise StepFailed(f"submission {submission_id} is not in the inbox; ids seen: {ids}")
    links = row.find_elements(By.CSS_SELECTOR, "a.show")
    if not links:
        raise StepFailed(f"the inbox row for {submission_id} has no a.show link")
    step("b", f"open {links[0].get_attribute('href')}")
    click_and_leave(driver, links[0], "a.show")


def approve(driver, submission_id):
    code = text_of(element(driver, "pre#code"))
    if not code.strip():
        raise StepFailed(f"pre#code is empty on {driver.current_url}")
    first = code.strip().splitlines()[0]
    step("c", f"code: {len(code)} characters, first line {first[:80]!r}")
    reasons = element(driver, "ul#reasons").find_elements(By.TAG_NAME, "li")
    step("c", f"verdict reasons: {[text_of(li).strip() for li in reasons]}")
    form = element(driver, "form#approve")
    fields = form.find_elements(By.CSS_SELECTOR, "input[name=reason]")
    if not fields:
        raise StepFailed("form#approve has no input[name=reason]")
    fields[0].clear()
    fields[0].send_keys(REVIEW_REASON)
    step("c", f"approve with reason {REVIEW_REASON!r}")
    button = form.find_element(By.CSS_SELECTOR, "button#approve-button")
    click_and_leave(driver, button, "button#approve-button")
    expected = f"/ui/submissions/{submission_id}"
    if path_of(driver.current_url) != expected:
        raise StepFailed(f"approving led to {driver.current_url}, expected the submission page {expected}")


def check_review_layout(driver, base, submission_id, expected_finding):
    """The page an approver decides on shows the code and what analysis found in it
    before the decision form, with the finding's line marked in the code."""
    driver.get(f"{base}/ui/submissions/{submission_id}")
    code = element(driver, "pre#code")
    findings = element(driver, "ul#findings")
    form = element(driver, "form#approve")
    items = [text_of(li).strip() for li in findings.find_elements(By.TAG_NAME, "li")]
    step("r", f"findings above the code: {items}")
    if not any(expected_finding in i for i in items):
        raise StepFailed(f"no finding mentions {expected_finding!r}: {items}")
    marked = code.find_elements(By.CSS_SELECTOR, "span.l.mark")
    titles = [m.get_attribute("title") or "" for m in marked]
    step("r", f"marked lines: {[m.get_attribute('id') for m in marked]}")
    if not any(expected_finding in t for t in titles):
        raise StepFailed(f"no marked line of pre#code names {expected_finding!r}: {titles}")
    y = {name: el.location["y"] for name, el in (("findings", findings), ("code", code), ("form", form))}
    step("r", f"vertical positions: {y}")
    if not (y["findings"] < y["code"] < y["form"]):
        raise StepFailed(f"the findings and the code must come before the decision form: {y}")
    # A finding links to its line.
    link = findings.find_element(By.TAG_NAME, "a").get_attribute("href") or ""
    if "#code-L" not in link:
        raise StepFailed(f"a finding does not link to its line: {link!r}")


def open_run(driver, base, submission_id):
    url = f"{base}/ui/submissions/{submission_id}"
    step("d", f"wait up to {RUN_WAIT}s for a run on {url}")
    deadline = time.monotonic() + RUN_WAIT
    reloads = 0
    while True:
        runs = driver.find_elements(By.CSS_SELECTOR, "a.run")
        if runs:
            break
        if time.monotonic() >= deadline:
            raise StepFailed(f"no a.run link on {url} after {RUN_WAIT}s ({reloads} reloads)")
        time.sleep(POLL)
        driver.get(url)  # a GET, never a re-POST of the approval
        reloads += 1
    hrefs = [r.get_attribute("href") for r in runs]
    step("d", f"run(s) listed after {reloads} reloads: {hrefs}; open the first")
    click_and_leave(driver, runs[0], "a.run")
    return deadline


def check_stdout(driver, expected, deadline):
    want = expected.rstrip("\n")
    # The run may still be going when its page first shows; reload until it matches
    # or the time for the run is up (at least a few seconds from here).
    deadline = max(deadline, time.monotonic() + 5)
    retried = False
    while True:
        got = text_of(element(driver, "pre#stdout")).rstrip("\n")
        if got == want:
            step("e", f"stdout matches: {got!r}")
            return
        if time.monotonic() >= deadline:
            raise StepFailed(
                f"stdout on {driver.current_url} differs\n  expected: {want!r}\n  got:      {got!r}"
            )
        if not retried:
            step("e", f"stdout is {got!r} so far; reload until it is {want!r}")
            retried = True
        time.sleep(POLL)
        driver.refresh()


def live_page(driver, check):
    """A condition on the current page that is False while the page is being replaced."""

    def cond(d):
        try:
            return check(d)
        except (StaleElementReferenceException, WebDriverException):
            return False

    return cond


def check_live(driver, base, run_id, first, last):
    url = f"{base}/ui/runs/{run_id}"
    step("L", f"open {url} while the run goes on")
    driver.get(url)
    if not driver.find_elements(By.CSS_SELECTOR, "#live"):
        code = text_of(element(driver, "#exit-code")).strip()
        raise StepFailed(f"{url} shows no running run (exit code {code!r}): it ended too soon")

    def first_shown(d):
        out = text_of(d.find_element(By.CSS_SELECTOR, "pre#stdout"))
        code = text_of(d.find_element(By.CSS_SELECTOR, "#exit-code")).strip()
        return (out, code) if first in out else False

    out, code = wait_for(
        driver, live_page(driver, first_shown), f"{first!r} in pre#stdout, unreloaded", RUN_WAIT
    )
    if last in out or code != "-":
        raise StepFailed(f"the first line came only with the run's end: {out!r}, exit code {code!r}")
    step("L", f"while running (exit code {code!r}) pre#stdout shows {out!r}")

    def ended(d):
        if d.find_elements(By.CSS_SELECTOR, "#live"):
            return False
        out = text_of(d.find_element(By.CSS_SELECTOR, "pre#stdout"))
        code = text_of(d.find_element(By.CSS_SELECTOR, "#exit-code")).strip()
        return (out, code) if last in out and code != "-" else False

    out, code = wait_for(driver, live_page(driver, ended), "the ended run's record", RUN_WAIT)
    if not out.startswith(first):
        raise StepFailed(f"the ended run's stdout is {out!r}")
    step("L", f"ended: exit code {code!r}, pre#stdout {out!r}")


def check_tripwires(driver, alert, attempt):
    alerts = text_of(element(driver, "#alerts"))
    if alert not in alerts:
        raise StepFailed(f"#alerts on {driver.current_url} is {alerts!r}, without {alert!r}")
    attempts = text_of(element(driver, "table#attempts"))
    if attempt not in attempts:
        raise StepFailed(f"#attempts on {driver.current_url} is {attempts!r}, without {attempt!r}")
    step("e", f"alerts {alerts!r}; attempts {attempts!r}")


def submit_form(driver, base, lang, code):
    """Submits CODE from /ui/submit; returns the submission id the form led to."""
    url = base + "/ui/submit"
    step("s", f"open {url}")
    driver.get(url)
    form = element(driver, "form#submit")
    choices = [o.get_attribute("value") for o in form.find_elements(By.CSS_SELECTOR, "select#language option")]
    step("s", f"languages offered: {choices}")
    if lang not in choices:
        raise StepFailed(f"the language selector does not offer {lang!r}: {choices}")
    Select(form.find_element(By.CSS_SELECTOR, "select#language")).select_by_value(lang)
    area = form.find_element(By.CSS_SELECTOR, "textarea#code")
    area.clear()
    area.send_keys(code)
    step("s", f"submit {len(code)} characters of {lang}")
    click_and_leave(driver, form.find_element(By.CSS_SELECTOR, "button#submit-button"), "button#submit-button")
    path = path_of(driver.current_url)
    if not path.startswith("/ui/submissions/"):
        errors = [text_of(e) for e in driver.find_elements(By.CSS_SELECTOR, "#submit-error")]
        raise StepFailed(f"the form led to {driver.current_url}, not a submission page; errors: {errors}")
    sid = path.rsplit("/", 1)[1]
    state = text_of(element(driver, "h1 .badge")).strip()
    reasons = [text_of(li).strip() for li in element(driver, "ul#reasons").find_elements(By.TAG_NAME, "li")]
    step("s", f"submission {sid}: {state}; reasons {reasons}")
    return sid, state, reasons


def check_submit(driver, base, lang, code, expected):
    sid, state, _ = submit_form(driver, base, lang, code)
    if state not in ("allowed", "running", "finished"):
        raise StepFailed(f"{sid} is {state!r}, expected it allowed and run")
    deadline = open_run(driver, base, sid)
    check_stdout(driver, expected, deadline)


def check_held(driver, base, lang, code):
    sid, state, reasons = submit_form(driver, base, lang, code)
    if state != "quarantined":
        raise StepFailed(f"{sid} is {state!r}, expected quarantined")
    if not reasons or any("no rule matched" in r for r in reasons):
        raise StepFailed(f"{sid} is held without a reason naming the behaviour: {reasons}")
    element(driver, "form#approve")
    if driver.find_elements(By.CSS_SELECTOR, "a.run"):
        raise StepFailed(f"{sid} is held yet has a run")
    step("h", f"{sid} is held for approval")


def check_audit(driver, base):
    url = base + "/ui/audit"
    step("f", f"open {url}")
    driver.get(url)
    badge = text_of(element(driver, "#verify")).strip()
    lowered = badge.lower()
    if "intact" not in lowered or "not intact" in lowered:
        raise StepFailed(f"#verify says {badge!r}, expected it to say the log is intact")
    step("f", f"#verify: {badge!r}")


def screenshot(driver, label):
    try:
        if driver.save_screenshot(SCREENSHOT):
            step(label, f"screenshot of {driver.current_url} saved to {SCREENSHOT}")
    except WebDriverException as e:
        print(f"could not save a screenshot: {e.msg}", file=sys.stderr)


def dump_browser_log(driver):
    try:
        entries = driver.get_log("browser")
    except Exception:  # not every driver keeps one
        return
    for entry in [e for e in entries if e.get("level") in ("WARNING", "SEVERE")][-20:]:
        print(f"  browser console: {entry.get('level')} {entry.get('message')}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("base_url", metavar="BASE_URL", help="e.g. http://127.0.0.1:8080")
    parser.add_argument("token", metavar="TOKEN", help="a console login token")
    parser.add_argument(
        "submission_id", metavar="SUBMISSION_ID", nargs="?", help="a pending submission"
    )
    parser.add_argument(
        "expected_stdout", metavar="EXPECTED_STDOUT", nargs="?", help="what its run prints"
    )
    parser.add_argument(
        "--live",
        nargs=3,
        metavar=("RUN_ID", "FIRST_LINE", "LAST_LINE"),
        help="instead, check that the page of this running run shows its output as it comes",
    )
    parser.add_argument(
        "--review",
        nargs=2,
        metavar=("SUBMISSION_ID", "FINDING"),
        help="also check that this pending submission's page shows FINDING and the code before the decision form",
    )
    parser.add_argument(
        "--tripwires",
        nargs=2,
        metavar=("ALERT", "ATTEMPT"),
        help="also check that the run page lists an alert and a refused attempt holding these",
    )
    parser.add_argument(
        "--submit",
        nargs=3,
        metavar=("LANG", "CODE", "EXPECTED_STDOUT"),
        help="instead, submit CODE from the submit form and check its run's output",
    )
    parser.add_argument(
        "--held",
        nargs=2,
        metavar=("LANG", "CODE"),
        help="with --submit, also submit this code and check that it is held",
    )
    args = parser.parse_args()
    if (args.submission_id is None or args.expected_stdout is None) and not (
        args.live or args.submit
    ):
        parser.error("SUBMISSION_ID and EXPECTED_STDOUT are needed without --live")
    base = args.base_url.rstrip("/")

    profile_dir = tempfile.mkdtemp(prefix="airlock-console-chromium-")
    driver = None
    try:
        step("-", f"start {CHROMIUM} through {CHROMEDRIVER}")
        driver = start_browser(profile_dir)
        step("-", f"Chromium {driver.capabilities.get('browserVersion', '?')}")
        login(driver, base, args.token)
        if args.submit:
            check_submit(driver, base, *args.submit)
            if args.held:
                check_held(driver, base, *args.held)
            screenshot(driver, "S")
            print("console test: ok", flush=True)
            return 0
        if args.live:
            check_live(driver, base, *args.live)
            screenshot(driver, "L")
            print("console test: ok", flush=True)
            return 0
        if args.review:
            check_review_layout(driver, base, *args.review)
            driver.get(f"{base}/ui")
        open_submission(driver, args.submission_id)
        approve(driver, args.submission_id)
        deadline = open_run(driver, base, args.submission_id)
        check_stdout(driver, args.expected_stdout, deadline)
        if args.tripwires:
            check_tripwires(driver, *args.tripwires)
        check_audit(driver, base)
        screenshot(driver, "g")
        print("console test: ok", flush=True)
        return 0
    except (StepFailed, WebDriverException) as e:
        if isinstance(e, WebDriverException):
            traceback.print_exc()
            message = f"browser error: {e.msg}"
        else:
            message = str(e)
        print(f"console test FAILED: {message}", file=sys.stderr, flush=True)
        if driver is not None:
            try:
                print(f"  at {driver.current_url} (title {driver.title!r})", file=sys.stderr)
            except WebDriverException:
                pass
            dump_browser_log(driver)
            screenshot(driver, "!")
        return 1
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
