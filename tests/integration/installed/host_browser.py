"""The host project's dashboard in a real browser (Debian's chromium, driven by Playwright).

An operator made by ``grant_role --create`` signs in on the dashboard's own
page, sees it styled (the collected stylesheet applied, htmx loaded), watches
a running job's timeline grow over the WebSocket, and cancels it.
"""

from __future__ import annotations

import os
import time

import httpx
import pytest

from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS

STYLED = """() => Array.from(document.styleSheets).some(
    (sheet) => (sheet.href || "").includes("/static/dashboard/app.") && sheet.cssRules.length > 20
) && typeof window.htmx === "object"
"""


def check_browser(url: str, username: str, password: str, token: str) -> None:
    if not CHROMIUM.exists():
        message = "the browser half needs /usr/bin/chromium (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import expect, sync_playwright

    api = httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Token {token}"})
    job = api.post(
        "/ops/jobs", json={"operation": "sleep", "payload": {"seconds": 60, "emit_every": 0.2}}
    )
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"{url}/ops/dashboard/")
            expect(page).to_have_url(f"{url}/ops/accounts/login/?next=/ops/dashboard/")
            page.wait_for_load_state("load")  # the URL changes before the stylesheet arrives
            assert page.evaluate(STYLED), "the sign-in page is not styled"
            page.fill("input[name=username]", username)
            page.fill("input[name=password]", password)
            page.get_by_role("button", name="Sign in").click()
            expect(page).to_have_url(f"{url}/ops/dashboard/")
            page.wait_for_load_state("load")
            assert page.evaluate(STYLED), "the dashboard is not styled"

            page.goto(f"{url}/ops/dashboard/jobs/{job_id}/")
            expect(page.locator("#live")).to_have_attribute("data-state", "live")
            progress = page.locator("#job-progress")
            expect(progress).to_contain_text("/")
            before = progress.inner_text()
            deadline = time.monotonic() + 20
            while progress.inner_text() == before:  # pushed over the socket, not reloaded
                assert time.monotonic() < deadline, f"the progress stayed at {before!r}"
                page.wait_for_timeout(100)

            page.once("dialog", lambda dialog: dialog.accept())
            page.get_by_role("button", name="Cancel", exact=True).click()
            expect(page.get_by_text("job.cancelled").first).to_be_visible()
        finally:
            browser.close()
    assert api.get(f"/ops/jobs/{job_id}").json()["status"] == "cancelled"
    api.close()
