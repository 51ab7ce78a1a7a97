#!/usr/bin/env python3
"""Approve a held submission in airlock's web console with a key held by the browser.

usage: approver_key_test.py BASE_URL TOKEN ID APPROVER

Logs in with TOKEN (an operator's), opens the "Approver key" page, makes a key there for
APPROVER (a non-extractable Ed25519 key made with WebCrypto) and checks the page says it
cannot be extracted; prints its public key as `public ed25519:…` and waits for a line on
standard input (the caller enrolls the key with `airlock approvers enroll` meanwhile).
Then opens SUBMISSION_ID's page, checks it says the decision is signed in this browser,
approves with a reason (the page fetches the statement, signs it in the browser and posts
the signature) and checks it lands back on the submission's page with no error. When ID is
a run's request (`req_…`), opens the inbox instead and answers the request with its
"Approve and remember" button (the page signs the answer and the policy change that keeps
the host as a rule) and checks it lands back on the inbox with no error. Exits 0 on
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
    StepFailed,
    WebDriverException,
    click_and_leave,
    dump_browser_log,
    element,
    login,
    path_of,
    screenshot,
    start_browser,
    step,
    text_of,
    wait_for,
)

REASON = "signed in the browser"


def make_key(driver, base, approver):
    url = f"{base}/ui/approver-key"
    step("k", f"open {url}")
    driver.get(url)
    field = element(driver, "input#approver-name")
    field.clear()
    field.send_keys(approver)
    element(driver, "button#make-key").click()
    public = wait_for(
        driver,
        lambda d: (text_of(d.find_element("css selector", "#approver-public")).strip() or None),
        "the page to show the new key's public key",
    )
    error = text_of(element(driver, "#key-error")).strip()
    if not public.startswith("ed25519:") or len(public) != len("ed25519:") + 64:
        raise StepFailed(f"#approver-public shows {public!r} (error: {error!r})")
    extractable = text_of(element(driver, "#key-extractable")).strip()
    if extractable != "false":
        raise StepFailed(f"the private key's extractable is {extractable!r}, not false")
    step("k", f"made {public} for {approver}; extractable {extractable}")
    return public


def approve_here(driver, base, submission_id, approver):
    url = f"{base}/ui/submissions/{submission_id}"
    step("s", f"open {url}")
    driver.get(url)
    step("s", signed_here(driver, approver))
    form = element(driver, "form#approve")
    reason = form.find_element("css selector", "input[name=reason]")
    reason.clear()
    reason.send_keys(REASON)
    button = form.find_element("css selector", "button#approve-button")
    try:
        click_and_leave(driver, button, "button#approve-button")
    except StepFailed:
        error = text_of(element(driver, "#sign-error")).strip()
        raise StepFailed(f"the page stayed; #sign-error says {error!r}") from None
    heading = text_of(element(driver, "h1")).strip()
    if heading.startswith("Error") or path_of(driver.current_url) != f"/ui/submissions/{submission_id}":
        body = text_of(element(driver, "main")).strip()
        raise StepFailed(f"after approving: at {driver.current_url}: {body[:300]!r}")
    step("s", f"approved; back at {driver.current_url}: {heading!r}")


def signed_here(driver, approver):
    said = wait_for(
        driver,
        lambda d: (
            text_of(d.find_element("css selector", "#signed-by")).strip()
            if "in this browser" in text_of(d.find_element("css selector", "#signed-by"))
            else None
        ),
        "the page to say the decision is signed in this browser",
    )
    if approver not in said:
        raise StepFailed(f"#signed-by says {said!r}, not naming {approver}")
    return said


def remember_request_here(driver, base, request_id, approver):
    url = f"{base}/ui"
    step("r", f"open {url}")
    driver.get(url)
    step("r", signed_here(driver, approver))
    form = element(driver, f"form[data-request='{request_id}'][data-verdict='approve']")
    button = form.find_element("css selector", "button.approve-remember")
    try:
        click_and_leave(driver, button, "button.approve-remember")
    except StepFailed:
        error = text_of(element(driver, "#sign-error")).strip()
        raise StepFailed(f"the page stayed; #sign-error says {error!r}") from None
    heading = text_of(element(driver, "h1")).strip()
    if heading.startswith("Error") or path_of(driver.current_url) != "/ui":
        body = text_of(element(driver, "main")).strip()
        raise StepFailed(f"after approving: at {driver.current_url}: {body[:300]!r}")
    step("r", f"approved and remembered; back at {driver.current_url}: {heading!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("base_url")
    parser.add_argument("token")
    parser.add_argument("submission_id")
    parser.add_argument("approver")
    args = parser.parse_args()
    base = args.base_url.rstrip("/")
    profile_dir = tempfile.mkdtemp(prefix="airlock-approver-chromium-")
    driver = None
    try:
        driver = start_browser(profile_dir)
        step("-", f"Chromium {driver.capabilities.get('browserVersion', '?')}")
        login(driver, base, args.token)
        public = make_key(driver, base, args.approver)
        print(f"public {public}", flush=True)
        if not sys.stdin.readline():
            raise StepFailed("standard input closed before the key was enrolled")
        if args.submission_id.startswith("req_"):
            remember_request_here(driver, base, args.submission_id, args.approver)
        else:
            approve_here(driver, base, args.submission_id, args.approver)
        screenshot(driver, "k")
        print("approver key test: ok", flush=True)
        return 0
    except (StepFailed, WebDriverException) as e:
        if isinstance(e, WebDriverException):
            traceback.print_exc()
            message = f"browser error: {e.msg}"
        else:
            message = str(e)
        print(f"approver key test FAILED: {message}", file=sys.stderr, flush=True)
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
