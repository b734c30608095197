"""Stopping ``runworker`` with real signals: what is logged, what a second signal does, how long.

- when the grace runs out, the worker logs ``job.requeued`` for a job it
  requeues (as the timeline says), never ``job.cancelled``;
- a second signal does not ``os._exit`` at once (which would leave jobs
  running until their leases expire, and the Worker row behind), and the
  time from the first signal to the exit is bounded even when a clean-up
  blocks on the database.

Chosen behaviour (docs/operations-and-cli.md, "Stopping a worker"): a second SIGTERM/SIGINT ends
the grace now, and the worker still requeues what runs and removes its row;
the process is gone by ``min(signal + grace, second signal) +
SHUTDOWN_CLEANUP_SECONDS`` whatever the database does.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from django.db import connection, transaction

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Worker
from tests.conftest import wait_for
from tests.integration.timelines import events_of
from workers.shutdown import REPEAT_SECONDS

pytestmark = pytest.mark.django_db(transaction=True)

LONG_JOB = {"seconds": 120, "emit_every": 0.2}


def _status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def _events(job: Job) -> list[str]:
    return events_of(job)


def _start(worker, grace: float, cleanup: float = 2.0):
    """A worker on a queue of its own, with one long job in hand."""
    queue = f"stop-{uuid.uuid4().hex[:6]}"
    job = enqueue("sleep", LONG_JOB, queue=queue)
    proc = worker(
        queue,
        env={
            "CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": str(grace),
            "CONTROLPLANE_SHUTDOWN_CLEANUP_SECONDS": str(cleanup),
        },
    )
    wait_for(
        lambda: JobEvent.objects.filter(job_id=job.pk, event="sleep.tick").exists(),
        timeout=30,
        message="the job running",
    )
    return proc, job


def _signal_and_wait_until_stopping(proc, sig: int) -> float:
    sent = time.monotonic()
    proc.signal(sig)
    wait_for(lambda: "worker.stopping" in proc.output(), timeout=10, message="worker.stopping")
    return sent


def _past_the_repeat_window(sent: float) -> None:
    """A signal sooner than this after the first is the first delivered twice (see below)."""
    wait_for(lambda: time.monotonic() - sent > REPEAT_SECONDS + 0.1, timeout=5, message="window")


def test_when_the_grace_runs_out_the_log_says_requeued_not_cancelled(worker):
    proc, job = _start(worker, grace=0.5)
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143, proc.output()
    assert _status(job) == "queued" and _events(job)[-1] == "job.requeued"
    out = proc.output()
    assert f"job.requeued job_id={job.pk} reason=shutdown" in out, out
    assert f"job.cancelled job_id={job.pk}" not in out, out
    assert f"job.stopped job_id={job.pk}" in out and "reason=shutdown" in out, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_ends_the_grace_and_still_requeues_and_unregisters(worker, sig):
    proc, job = _start(worker, grace=60)
    sent = _signal_and_wait_until_stopping(proc, sig)
    _past_the_repeat_window(sent)
    assert _status(job) == "running"  # the grace is on: the job may still finish
    second = time.monotonic()
    proc.signal(sig)
    assert proc.wait(timeout=15) == 143, proc.output()
    assert time.monotonic() - second < 5, "a second signal should not wait out the 60 s grace"
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.attempts, stored.lease_token) == ("queued", 0, None)
    requeued = JobEvent.objects.filter(job_id=job.pk).order_by("-seq").first()
    assert requeued is not None and requeued.event == "job.requeued"
    assert "second signal" in requeued.message
    assert not Worker.objects.exists(), "the Worker row is removed on the way out"
    out = proc.output()
    assert "worker.grace_skipped" in out and f"job.requeued job_id={job.pk}" in out, out


def test_the_exit_is_bounded_even_when_the_clean_up_cannot_reach_the_database(worker):
    grace, cleanup = 0.5, 1.0
    proc, job = _start(worker, grace=grace, cleanup=cleanup)
    sent = _signal_and_wait_until_stopping(proc, signal.SIGTERM)
    # Hold what the requeue needs: the job's row (PostgreSQL) or the one write
    # lock (SQLite). Before the bound, the worker waited on it for as long as it was held.
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT 1 FROM controlplane_job WHERE id = %s FOR UPDATE", [job.pk])
            else:
                cursor.execute("UPDATE controlplane_queue SET paused = paused WHERE 1 = 0")
        try:
            code = proc.wait(timeout=grace + cleanup + 8)
        finally:
            elapsed = time.monotonic() - sent
    assert code == 143, proc.output()
    # Signal to exit: the grace, the clean-up bound, and process start-up slack.
    assert elapsed < grace + cleanup + 4, elapsed
    assert "worker.exit_forced" in proc.output()
    # What it could not requeue keeps its lease, which expires; the reaper requeues it.
    # (On PostgreSQL the blocked UPDATE may still run once the lock is released: the
    # server finishes a statement whose client has gone. Either way nothing is lost.)
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status == "running" and stored.leased_until is not None) or (
        connection.vendor == "postgresql" and stored.status == "queued"
    ), (stored.status, stored.leased_until)


def test_one_stop_delivered_twice_keeps_the_grace(worker):
    """systemd's default KillMode=control-group signals every process of the unit, and
    ``runworker --processes`` forwards the same signal: each child gets it twice at once."""
    queue = f"twice-{uuid.uuid4().hex[:6]}"
    job = enqueue("sleep", {"seconds": 2, "emit_every": 0.2}, queue=queue)
    proc = worker(
        queue, args=("--processes", "2"), env={"CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "30"}
    )
    wait_for(lambda: Worker.objects.count() == 2, timeout=30, message="both children up")
    wait_for(
        lambda: JobEvent.objects.filter(job_id=job.pk, event="sleep.tick").exists(),
        timeout=30,
        message="the job running",
    )
    children = list(Worker.objects.values_list("pid", flat=True))
    proc.signal(signal.SIGTERM)  # the supervisor forwards it to its children …
    for pid in children:  # … which the service manager signalled as well
        os.kill(pid, signal.SIGTERM)
    # Within the grace, the job finishes: no child took the repeat for a second signal.
    assert proc.wait(timeout=30) == 0, proc.output()
    assert _status(job) == "succeeded"
    assert "worker.grace_skipped" not in proc.output()
    assert not Worker.objects.exists()
