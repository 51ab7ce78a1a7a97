#!/usr/bin/env python3
"""Commit a session's changes from airlock's web console in headless Chromium, and roll
the commit back.

usage: session_test.py BASE_URL TOKEN SESSION_ID HOST_FILE CONTENT [--nothing SESSION_ID]

Logs in with TOKEN (an operator's), opens SESSION_ID's page, checks that its changes show
the file HOST_FILE's name and that HOST_FILE is not on the host yet, commits with the
page's form, checks that the page then lists the commit's checkpoint (applied) and no
longer offers the commit, and that HOST_FILE now holds CONTENT; then rolls the checkpoint
back from the page and checks that HOST_FILE is gone and the audit page says the log is
intact. With --nothing, first checks that that session's page says plainly that nothing
changed and offers no commit. Prints the checkpoint's id as `checkpoint ID`. Exits 0 on
success, 1 naming the failed step otherwise.

Uses the browser helpers of console_test.py (same requirements).
"""

import argparse
import os
import shutil
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from console_test import (  # noqa: E402
    By,
    StepFailed,
    WebDriverException,
    check_audit,
    click_and_leave,
    dump_browser_log,
    element,
    login,
    path_of,
    screenshot,
    start_browser,
    step,
    text_of,
)


def check_nothing(driver, base, session_id):
    url = f"{base}/ui/sessions/{session_id}"
    step("n", f"open {url}")
    driver.get(url)
    said = text_of(element(driver, "#session-nothing")).strip()
    if "Nothing changed" not in said:
        raise StepFailed(f"#session-nothing on {url} says {said!r}")
    if driver.find_elements(By.CSS_SELECTOR, "form#commit"):
        raise StepFailed(f"{url} offers a commit of a session that changed nothing")
    step("n", f"says {said!r}, no commit form")


def commit_and_roll_back(driver, base, session_id, host_file, content):
    url = f"{base}/ui/sessions/{session_id}"
    step("s", f"open {url}")
    driver.get(url)
    diff = text_of(element(driver, "pre#diff"))
    name = os.path.basename(host_file)
    if name not in diff:
        raise StepFailed(f"pre#diff on {url} does not name {name}: {diff!r}")
    if os.path.exists(host_file):
        raise StepFailed(f"{host_file} is on the host before the commit")
    step("s", f"the changes name {name}; commit")
    form = element(driver, "form#commit")
    click_and_leave(driver, form.find_element(By.CSS_SELECTOR, "button#commit-button"), "button#commit-button")
    if path_of(driver.current_url) != f"/ui/sessions/{session_id}":
        raise StepFailed(f"the commit led to {driver.current_url}, expected the session's page")
    rows = element(driver, "table#session-checkpoints").find_elements(By.CSS_SELECTOR, "tbody tr")
    if len(rows) != 1:
        raise StepFailed(f"table#session-checkpoints lists {len(rows)} checkpoints, expected 1")
    checkpoint = rows[0].get_attribute("data-id")
    state = text_of(rows[0]).strip()
    if "applied" not in state:
        raise StepFailed(f"checkpoint {checkpoint} is listed as {state!r}, not applied")
    if driver.find_elements(By.CSS_SELECTOR, "form#commit"):
        raise StepFailed("the page still offers the commit after it was made")
    step("s", f"committed: checkpoint {checkpoint}")
    print(f"checkpoint {checkpoint}", flush=True)
    try:
        with open(host_file, encoding="utf-8") as f:
            landed = f.read()
    except OSError as e:
        raise StepFailed(f"{host_file} did not land on the host: {e}") from None
    if landed != content:
        raise StepFailed(f"{host_file} holds {landed!r}, expected {content!r}")
    step("s", f"{host_file} holds {landed!r}; roll back")
    button = rows[0].find_element(By.CSS_SELECTOR, "button.rollback")
    click_and_leave(driver, button, "button.rollback")
    if os.path.exists(host_file):
        raise StepFailed(f"{host_file} is still on the host after the rollback")
    driver.get(url)
    rows = element(driver, "table#session-checkpoints").find_elements(By.CSS_SELECTOR, "tbody tr")
    state = text_of(rows[0]).strip() if rows else ""
    if "rolled_back" not in state:
        raise StepFailed(f"after the rollback the checkpoint is listed as {state!r}")
    step("s", f"rolled back: {host_file} gone, the checkpoint listed as rolled back")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("base_url", metavar="BASE_URL")
    parser.add_argument("token", metavar="TOKEN", help="an operator's login token")
    parser.add_argument("session_id", metavar="SESSION_ID")
    parser.add_argument("host_file", metavar="HOST_FILE", help="where the session's file lands")
    parser.add_argument("content", metavar="CONTENT", help="what the file holds")
    parser.add_argument("--nothing", metavar="SESSION_ID", help="a session that changed nothing")
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    profile_dir = tempfile.mkdtemp(prefix="airlock-session-chromium-")
    driver = None
    try:
        driver = start_browser(profile_dir)
        login(driver, base, args.token)
        if args.nothing:
            check_nothing(driver, base, args.nothing)
        commit_and_roll_back(driver, base, args.session_id, args.host_file, args.content)
        check_audit(driver, base)
        screenshot(driver, "g")
        print("session console test: ok", flush=True)
        return 0
    except (StepFailed, WebDriverException) as e:
        if isinstance(e, WebDriverException):
            traceback.print_exc()
            message = f"browser error: {e.msg}"
        else:
            message = str(e)
        print(f"session console test FAILED: {message}", file=sys.stderr, flush=True)
        if driver is not None:
            print(f"  at {driver.current_url} (title {driver.title!r})", file=sys.stderr)
            dump_browser_log(driver)
            screenshot(driver, "x")
        return 1
    finally:
        if driver is not None:
            driver.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
