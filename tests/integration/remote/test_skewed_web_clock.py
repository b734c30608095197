"""A web process whose clock is 45 s off stamps remote workers with the database's time.

The sweeper compares a remote worker's ``last_heartbeat`` with the database's
clock; a registration or heartbeat stamped by a slow web host would make a live
worker look silent (and a fast one keep a dead worker alive).
"""

from __future__ import annotations

import os
from datetime import timedelta

import httpx
import pytest
from django.db import connection

from jobs.clock import db_now
from jobs.models import RemoteOperation, Worker
from tests.integration.engine.test_clock_skew import FAKETIME_LIB, skewed

from .helpers import register, start_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("_skew_ready")]
CLOSE = timedelta(seconds=10)  # far below the skew


@pytest.fixture
def _skew_ready() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("clock skew across machines: PostgreSQL only (SQLite is one machine)")
    if not FAKETIME_LIB.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FAKETIME_LIB} is missing: apt-get install faketime")
        pytest.skip(f"{FAKETIME_LIB} is missing: apt-get install faketime")


def test_registration_heartbeat_and_disconnect_use_the_database_clock(tmp_path, token):
    server = start_server(tmp_path, extra_env=skewed(-45))
    try:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Token {token}"}, trust_env=False
        ) as api:
            worker_id = register(api)["id"]
            beat = Worker.objects.get(pk=worker_id).last_heartbeat
            assert abs(beat - db_now()) < CLOSE, beat

            assert api.patch(f"/workers/{worker_id}", json={}).status_code == 200
            beat = Worker.objects.get(pk=worker_id).last_heartbeat
            assert abs(beat - db_now()) < CLOSE, beat

            assert api.delete(f"/workers/{worker_id}").status_code in (200, 204)
            seen = RemoteOperation.objects.values_list("last_seen_at", flat=True).get()
            assert abs(seen - db_now()) < CLOSE, seen
    finally:
        server.proc.stop()
