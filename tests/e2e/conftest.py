"""Browser tests: a real daphne serving the test database, driven by Debian's chromium.

Daphne (not Django's LiveServer) because the pages need WebSockets. One
daphne and one browser serve each test module (module scope, so that
Playwright's event loop is gone before any async test runs); each test gets fresh
browser contexts (cookies) and logs in by session cookie, except the login
test itself. Skipped cleanly where /usr/bin/chromium is missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import (
    FAST_KNOBS,
    ROOT,
    database_url_for_subprocess,
    wait_for_other_sessions_to_finish,
)
from tests.factories import make_user

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Fast live updates for tests; the polling fallback starts at half a second.
SERVER_KNOBS = {
    "DASHBOARD_RELAY_INTERVAL_SECONDS": "0.2",
    "DASHBOARD_SUMMARY_REFRESH_SECONDS": "0.5",
    "DASHBOARD_WORKERS_REFRESH_SECONDS": "2",
    "DASHBOARD_POLL_BASE_MS": "500",
    "DASHBOARD_POLL_MAX_MS": "4000",
    "DASHBOARD_TIMELINE_PAGE": "20",
    "DJANGO_DEBUG": "0",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not CHROMIUM.exists():
        skip = pytest.mark.skip(reason="browser tests need /usr/bin/chromium")
        for item in items:
            if "e2e" in item.keywords:
                item.add_marker(skip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"daphne did not answer within {timeout} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """A daphne on a free port serving the test database; its base URL."""
    if not CHROMIUM.exists():
        pytest.skip("browser tests need /usr/bin/chromium")
    port = _free_port()
    env = {**os.environ, **FAST_KNOBS, **SERVER_KNOBS}
    env["DATABASE_URL"] = database_url_for_subprocess()
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("CONTROLPLANE_TEST_DB_NAME", None)
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "daphne"),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "controlplane.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/accounts/login/", proc, log)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread, so Django would
    # take the tests' own (synchronous) database calls for async code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    chromium = playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )
    try:
        yield chromium
    finally:
        chromium.close()
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def open_page(browser, server, transactional_db) -> Iterator[Callable[..., object]]:
    """``open_page(role)``: a page in a fresh context, logged in as a new user of that role.

    ``role=None`` stays anonymous. Script errors on the page fail the test.
    """
    contexts = []
    pages = []

    def open_as(
        role: str | None = "operator",
        *,
        username: str | None = None,
        color_scheme: str = "light",
        viewport: dict | None = None,
    ):
        context = browser.new_context(
            base_url=server,
            color_scheme=color_scheme,
            viewport=viewport or {"width": 1360, "height": 900},
        )
        contexts.append(context)
        if role is not None:
            client = Client()
            client.force_login(make_user(role, username))
            context.add_cookies(
                [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": server}]
            )
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.script_errors = []  # type: ignore[attr-defined]
        page.on("pageerror", lambda error: page.script_errors.append(str(error)))
        # Console errors include Content-Security-Policy refusals: a page must cause none.
        page.on(
            "console",
            lambda msg: (
                msg.type == "error"
                and "WebSocket" not in msg.text
                and page.script_errors.append(msg.text)
            ),
        )
        page.on("dialog", lambda dialog: dialog.accept())
        pages.append(page)
        return page

    yield open_as
    for page in pages:
        assert not page.script_errors, page.script_errors
    for context in contexts:
        context.close()
    wait_for_other_sessions_to_finish()  # daphne's last reads, racing the closed sockets
