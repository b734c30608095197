"""Migrations match the models, and the PostgreSQL-only pieces of 0002 are there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from jobs.enqueue import enqueue
from jobs.models import OperatorAction
from jobs.transitions import emit_event

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.django_db


def test_makemigrations_finds_no_changes(tmp_path):
    """A model edit without its migration fails here, on every hash seed."""
    for seed in ("0", "1", "2"):
        env = {
            "PATH": "/usr/bin:/bin",
            "PYTHONHASHSEED": seed,
            "DATABASE_URL": f"sqlite:///{tmp_path / 'mm.sqlite3'}",
        }
        done = subprocess.run(
            [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_operator_action_keeps_the_username_when_the_user_goes():
    user = User.objects.create_user("op-audit")
    older = OperatorAction.objects.create(
        user=user, username=user.username, action="pause", target="default"
    )
    newer = OperatorAction.objects.create(
        user=user,
        username=user.username,
        action="bulk_cancel",
        target="filter",
        filter={"queue": "q"},
        count=3,
        reason="runaway",
    )
    user.delete()
    rows = list(OperatorAction.objects.all())
    assert [r.pk for r in rows] == [newer.pk, older.pk], "newest first"
    assert rows[0].user_id is None and rows[0].username == "op-audit"
    assert rows[0].filter == {"queue": "q"} and rows[0].count == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_new_events_notify_controlplane_events():
    """Committed event inserts send NOTIFY controlplane_events (the dashboard relay LISTENs)."""
    import psycopg

    settings = connection.settings_dict
    listener = psycopg.connect(
        dbname=settings["NAME"],
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=settings.get("HOST") or "127.0.0.1",
        port=settings.get("PORT") or 5432,
        autocommit=True,
    )
    try:
        listener.execute("LISTEN controlplane_events")
        assert list(listener.notifies(timeout=0.1, stop_after=1)) == []
        job = enqueue("ping", {}, queue="notify-test")  # the job row only: job.enqueued is implied
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        emit_event(job.pk, event="t.notify")  # a stored event (seq 2), committed
        got = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in got] == [("controlplane_events", "")]
    finally:
        listener.close()
