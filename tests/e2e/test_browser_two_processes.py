"""The live timeline in a real browser when ``manage.py serve`` runs two server processes.

Each process relays database changes to the pages connected to it (its own
LISTEN connection, or its own poll on SQLite), so every open page updates,
whichever process its WebSocket landed on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.conftest import FAST_KNOBS, ROOT, database_url_for_subprocess
from tests.e2e.conftest import CHROMIUM, SERVER_KNOBS, _free_port, _wait_http
from tests.factories import ECHO, running, tick
from tests.integration.web.conftest import session_static

pytestmark = pytest.mark.e2e

PAGES = 4  # with two processes, all four sockets land on one with probability 1/8


@pytest.fixture(scope="module")
def server(django_db_setup, tmp_path_factory) -> Iterator[str]:
    """``manage.py serve --processes 2`` on a free port, serving the test database."""
    if not CHROMIUM.exists():
        pytest.skip("browser tests need /usr/bin/chromium")
    port = _free_port()
    logs = tmp_path_factory.mktemp("serve")
    env = {**os.environ, **FAST_KNOBS, **SERVER_KNOBS}
    env["DATABASE_URL"] = database_url_for_subprocess()
    env["PYTHONUNBUFFERED"] = "1"
    # The session's collected static files (hashed names, as serve collects them).
    env["CONTROLPLANE_STATIC_ROOT"] = str(session_static(tmp_path_factory))
    env["CONTROLPLANE_STATIC_MANIFEST"] = "1"
    env.pop("CONTROLPLANE_TEST_DB_NAME", None)
    log = logs / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--processes", "2"]
            + ["--no-collectstatic"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/accounts/login/", proc, log, timeout=60)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_every_page_updates_live_when_two_processes_serve(open_page) -> None:
    job, held = running(ECHO, {"seconds": 3})
    pages = [open_page("viewer") for _ in range(PAGES)]
    for page in pages:
        page.goto(f"/dashboard/jobs/{job.pk}/")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
    tick(job, held, 1, 3, "seen by every page")
    for page in pages:
        expect(page.locator("#timeline")).to_contain_text("seen by every page")
        expect(page.locator("#job-progress")).to_contain_text("1 / 3")
