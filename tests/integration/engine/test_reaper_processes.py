"""The reaper as real processes: timeout with stall grace, two reapers at once, retention."""

from __future__ import annotations

import re
import signal
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import transitions
from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import BatchMessage, Job, JobEvent, Worker
from jobs.operations import registry
from tests.conftest import wait_for
from tests.factories import context, running

pytestmark = pytest.mark.django_db(transaction=True)


def status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def count(job, event: str) -> int:
    return JobEvent.objects.filter(job_id=job.pk, event=event).count()


def counters(output: str, name: str) -> int:
    """The sum of one counter over every ``reaper.pass`` line of a reaper's log."""
    return sum(int(n) for n in re.findall(rf"reaper\.pass .*?\b{name}=(\d+)", output))


def test_the_timeout_fails_a_stalled_job_and_spares_a_busy_one(worker, start_process):
    env = {"CONTROLPLANE_REAPER_TIMEOUT_SECONDS": "1", "CONTROLPLANE_REAPER_STALL_SECONDS": "2"}
    busy = enqueue("sleep", {"seconds": 60, "emit_every": 0.2})
    stalled = enqueue("sleep", {"seconds": 60, "emit_every": 30})
    proc = worker(args=("--concurrency", "2"))
    reaper = start_process("reaper", "--interval", "0.2", env=env)  # starts beside the worker
    wait_for(lambda: status(busy) == status(stalled) == "running", message="both running")
    wait_for(lambda: status(stalled) == "failed", timeout=30, message="the stalled job failed")
    stalled.refresh_from_db()
    assert stalled.error_code == "JobTimeout"
    assert count(stalled, "job.timeout") == 1
    # The busy job, past the same timeout, lives on: its events keep it alive.
    started = Job.objects.get(pk=busy.pk).started_at
    assert timezone.now() - started > timedelta(seconds=2)
    ticks = count(busy, "sleep.tick")
    wait_for(lambda: count(busy, "sleep.tick") > ticks + 5, message="the busy job still ticking")
    assert status(busy) == "running" and count(busy, "job.timeout") == 0
    # The worker finds out at its next heartbeat and writes nothing over the failure.
    wait_for(lambda: f"job_id={stalled.pk}" in proc.output(), message="worker let go")
    transitions.cancel_job(busy.pk)
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0
    assert status(stalled) == "failed" and count(stalled, "job.succeeded") == 0
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0


def test_two_reaper_processes_requeue_once_then_fail_once(start_process):
    env = {"CONTROLPLANE_MAX_LEASE_REQUEUES": "1"}
    reapers = [start_process("reaper", "--interval", "0.05", env=env) for _ in range(2)]
    for reaper in reapers:
        wait_for(lambda r=reaper: "reaper.pass" in r.output(), message="reaper passing")
    queue = f"q-{uuid.uuid4().hex[:8]}"  # served by no worker
    jobs = [enqueue("ping", {}, queue=queue) for _ in range(30)]
    ids = [j.pk for j in jobs]
    ghost = uuid.uuid4()
    for event, final in [("job.lease_expired_requeue", "queued"), ("job.lease_expired", "failed")]:
        # Every lease expires at the same instant, under both reapers.
        assert len(claim_jobs(queues=[queue], worker_id=ghost, limit=30, lease_seconds=0.5)) == 30
        wait_for(
            lambda f=final: Job.objects.filter(pk__in=ids, status=f).count() == 30,
            timeout=30,
            message=f"all {final}",
        )
        per_job = [count(j, event) for j in jobs]
        assert per_job == [1] * 30, per_job
    for reaper in reapers:
        reaper.signal(signal.SIGTERM)
        assert reaper.wait(timeout=10) == 0
    outputs = [r.output() for r in reapers]
    assert sum(counters(o, "lease_requeued") for o in outputs) == 30
    assert sum(counters(o, "lease_failed") for o in outputs) == 30
    rows = Job.objects.filter(pk__in=ids)
    assert {(r.error_code, r.lease_requeues) for r in rows} == {("LeaseExpired", 1)}


def test_retention_over_several_batches_with_the_purge(start_process):
    long_ago = timezone.now() - timedelta(days=30)
    old = [enqueue("ping") for _ in range(11)]
    old_parent = enqueue("ping")
    old_child = enqueue("ping", parent=old_parent.pk)
    recent = enqueue("ping")
    transitions.cancel_jobs([j.pk for j in [*old, old_parent, recent]])
    Job.objects.filter(pk__in=[j.pk for j in [*old, old_parent, old_child]]).update(
        finished_at=long_ago
    )
    # A coordinator that timed out left its 10 batch messages behind; a running one keeps its own.
    gone, gone_held = running("fanout", payload={"batches": 10})
    registry.get("fanout").execute(context(gone_held), gone_held.payload)
    transitions.move(
        target=transitions.FAILED,
        job_ids=[gone.pk],
        event=transitions.Event("job.timeout", level="error"),
        assign={
            "finished_at": timezone.now(),
            "error_code": "JobTimeout",
            **transitions.CLEAR_LEASE,
        },
    )
    alive, alive_held = running("fanout", payload={"batches": 3})
    registry.get("fanout").execute(context(alive_held), alive_held.payload)
    connection.close()  # nothing held open against the reaper process

    env = {"CONTROLPLANE_RETENTION_BATCH_SIZE": "4", "CONTROLPLANE_RETENTION_DAYS": "7"}
    proc = start_process("reaper", "--once", env=env)
    assert proc.wait(timeout=60) == 0, proc.output()
    out = proc.output()
    # 12 leaves in three full batches, then the parent they freed, in the same pass.
    assert "jobs_deleted=13" in out and "messages_purged=10" in out and "errors=0" in out, out
    deleted = [j.pk for j in [*old, old_parent, old_child]]
    assert not Job.objects.filter(pk__in=deleted).exists()
    assert not JobEvent.objects.filter(job_id__in=deleted).exists()
    assert Job.objects.filter(pk=recent.pk).exists()
    assert not BatchMessage.objects.filter(parent_id=gone.pk).exists()
    assert BatchMessage.objects.filter(parent_id=alive.pk).count() == 3


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite workers poll; no NOTIFY")
def test_operator_retry_and_a_lease_requeue_wake_an_idle_worker_at_once(worker, start_process):
    slow_poll = {"CONTROLPLANE_POLL_SECONDS": "60"}
    job = enqueue("fail", {"message": "once"}, max_attempts=1)
    proc = worker(env=slow_poll)
    wait_for(lambda: status(job) == "failed", message="failed")
    wait_for(lambda: f"job.failed job_id={job.pk}" in proc.output(), message="worker idle")
    transitions.retry_job(job.pk, by="tester")
    # Far sooner than the 60 s poll: the retry's NOTIFY woke the worker.
    wait_for(lambda: count(job, "job.started") == 2, timeout=10, message="claimed again")

    sleeper = enqueue("sleep", {"seconds": 60, "emit_every": 0.2}, queue="naps")
    doomed = worker("naps", env={**slow_poll, "CONTROLPLANE_LEASE_SECONDS": "1"})
    wait_for(lambda: status(sleeper) == "running", message="sleeper running")
    idle = worker("naps", env=slow_poll)
    wait_for(lambda: Worker.objects.filter(pid=idle.pid).exists(), message="second worker up")
    doomed.signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    start_process("reaper", "--interval", "0.2")
    wait_for(lambda: count(sleeper, "job.started") == 2, timeout=15, message="reclaimed")
    transitions.cancel_job(sleeper.pk)
