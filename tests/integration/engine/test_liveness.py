"""Dead local workers found by their ended session (PostgreSQL), not by their lease.

The lease stays at its default (30 s) and the reaper's pass interval at 60 s:
only the liveness check (``workers.liveness``) can rescue a job in time here.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from django.db import connection

from jobs.enqueue import enqueue
from jobs.models import Job, Worker
from tests.conftest import wait_for
from tests.integration.timelines import events_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="advisory locks: PostgreSQL"),
]

REAPER_ENV = {
    "CONTROLPLANE_WORKER_LOST_SECONDS": "1",
    "CONTROLPLANE_WORKER_LIVENESS_SECONDS": "0.2",
}


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def events(job: Job) -> list[str]:
    return events_of(job)


def marked(worker_id: uuid.UUID) -> bool:
    return Worker.objects.filter(pk=worker_id, liveness_lock=True).exists()


def test_a_killed_worker_s_job_is_requeued_long_before_its_lease_runs_out(worker, start_process):
    job = enqueue("sleep", {"seconds": 60})
    doomed_id = uuid.uuid4()
    doomed = worker(args=("--worker-id", str(doomed_id)))
    wait_for(lambda: status(job) == "running" and marked(doomed_id), message="running, lock held")
    reaper = start_process("reaper", "--interval", "60", env=REAPER_ENV)
    wait_for(lambda: "reaper.pass" in reaper.output(), message="the reaper's first pass")
    doomed.signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    wait_for(
        lambda: status(job) == "queued",
        timeout=15,  # the lease alone would take 30 s, the next pass 60 s
        message="the killed worker's job requeued by the liveness check",
    )
    assert events(job)[-1] == "job.lease_expired_requeue"
    # The row goes in the reaper's next statement, after the rescue's commit.
    wait_for(
        lambda: not Worker.objects.filter(pk=doomed_id).exists(),
        timeout=10,
        message="the lost worker's row removed",
    )
    wait_for(lambda: "reaper.workers_lost" in reaper.output(), timeout=10, message="its log")
    # A new worker takes the job up again.
    job_after = enqueue("ping", {})
    rescuer = worker(args=("--concurrency", "2"))
    wait_for(lambda: status(job_after) == "succeeded", message="a live worker serving")
    wait_for(lambda: status(job) == "running", message="the rescued job claimed again")
    for proc in (rescuer, reaper):
        proc.signal(signal.SIGTERM)
    reaper.wait(timeout=10)


def test_a_live_worker_whose_session_is_cut_keeps_its_job(worker, start_process):
    job = enqueue("sleep", {"seconds": 60})
    alive_id = uuid.uuid4()
    alive = worker(
        args=("--worker-id", str(alive_id)), env={"CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "0.5"}
    )
    wait_for(lambda: status(job) == "running" and marked(alive_id), message="running, lock held")
    reaper = start_process("reaper", "--interval", "60", env=REAPER_ENV)
    wait_for(lambda: "reaper.pass" in reaper.output(), message="the reaper's first pass")
    # Cut the session that holds the worker's lock (as a pooler or an operator might).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s AND granted AND pid <> pg_backend_pid() AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            [0x63706C76],
        )
        assert cursor.fetchone()[0] is True
    wait_for(lambda: "listener.reconnect" in alive.output(), message="the listener reconnecting")

    def lock_held_again() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                "AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                [0x63706C76],
            )
            return cursor.fetchone()[0] == 1

    wait_for(lock_held_again, timeout=10, message="the worker's lock taken again")
    # Several liveness checks later the job is still the live worker's.
    time.sleep(1.5)  # the 1 s grace and two checks: a wrong verdict would have landed by now
    assert status(job) == "running"
    assert "job.lease_expired_requeue" not in events(job)
    assert Worker.objects.filter(pk=alive_id).exists()
    assert "reaper.workers_lost" not in reaper.output()
    for proc in (alive, reaper):
        proc.signal(signal.SIGTERM)
    assert alive.wait(timeout=30) in (0, 143)
