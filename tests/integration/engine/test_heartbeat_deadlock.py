"""A worker must not deadlock with itself.

The batched success write (``complete_and_claim``) locks the batch's rows in
the batch's order; the heartbeat (``extend_leases``) locked the same worker's
rows in the index's order, and each waited for the other: ``deadlock
detected``, a second of ``deadlock_timeout`` each time. The heartbeat now
never waits for a job row (``FOR UPDATE SKIP LOCKED``).
"""

from __future__ import annotations

import random
import threading
import time
import uuid

import psycopg
import pytest
from django.db import connection

from jobs.claims import claim_jobs, extend_leases
from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job, Worker
from tests.conftest import database_url_for_subprocess, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="row locks and deadlocks are PostgreSQL's"
    ),
]


def test_the_heartbeat_never_waits_for_a_locked_job_row_nor_calls_it_lost():
    worker_id = uuid.uuid4()
    Worker.objects.create(pk=worker_id, name="w", queues=["default"])
    enqueue_many([JobSpec("ping") for _ in range(3)])
    a, b, c = claim_jobs(queues=["default"], worker_id=worker_id, limit=3, lease_seconds=30)
    before = dict(Job.objects.values_list("pk", "leased_until"))
    # Another session holds b's row, as the worker's own success write does mid-statement.
    with psycopg.connect(database_url_for_subprocess(), autocommit=False) as other:
        other.execute("SELECT 1 FROM controlplane_job WHERE id = %s FOR UPDATE", [b.id])
        outcome: dict = {}

        def beat() -> None:
            try:
                outcome["lost"] = extend_leases(
                    worker_id=worker_id,
                    held=[(j.id, j.lease_token) for j in (a, b, c)],
                    lease_seconds=600,
                )
            finally:
                connection.close()

        thread = threading.Thread(target=beat)
        thread.start()
        thread.join(timeout=5)
        waited = thread.is_alive()
        other.rollback()
        thread.join(timeout=10)
    assert not waited, "the heartbeat waited for a row another transaction held"
    assert outcome["lost"] == set()  # b is still ours: skipped this beat, not lost
    after = dict(Job.objects.values_list("pk", "leased_until"))
    assert after[a.id] > before[a.id] and after[c.id] > before[c.id]
    assert after[b.id] == before[b.id]  # its lease is extended at the next beat


def _deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def _other_sessions() -> set[int]:
    """Backends of the test database besides this one (PostgreSQL 15+ flushes a backend's
    statistics before it leaves ``pg_stat_activity``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return {pid for (pid,) in cursor.fetchall()}


def test_a_drain_with_a_fast_heartbeat_has_no_deadlock(worker):
    """3,000 jobs through two workers beating every 5 ms: the database counts no deadlock.

    The jobs take 0-20 ms each, so each batch finishes (and is written) in an
    order unlike its ids', the order the heartbeat reads them in.
    """
    rng = random.Random(27)
    before = _deadlocks()
    # Sessions this test process (or an earlier test) holds: only the workers' must go.
    already = _other_sessions()
    enqueue_many(
        [
            JobSpec("sleep", payload={"seconds": rng.randint(0, 20) / 1000, "emit_every": 1})
            for _ in range(3000)
        ]
    )
    knobs = {"CONTROLPLANE_HEARTBEAT_SECONDS": "0.005"}
    procs = [worker(args=("--burst", "--concurrency", "32"), env=knobs) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.output()[-3000:]
    assert Job.objects.filter(status="succeeded").count() == 3000
    # A backend's counters reach pg_stat_database when it exits, or once it has been idle
    # for PGSTAT_IDLE_INTERVAL (10 s): through PgBouncer the server sessions stay pooled.
    flushed_by = time.monotonic() + 11
    wait_for(
        lambda: _other_sessions() <= already or time.monotonic() > flushed_by,
        timeout=20,
        interval=0.02,
        message="the workers' backends to exit or flush their statistics",
    )
    assert _deadlocks() == before, "deadlock detected during the drain"
    for proc in procs:
        assert "deadlock" not in proc.output()
