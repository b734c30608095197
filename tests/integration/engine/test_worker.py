"""The worker engine as real processes with real signals, on PostgreSQL and SQLite."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from jobs import transitions
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent, Queue, Worker
from tests.conftest import wait_for
from tests.integration.timelines import events_of, timeline_of

pytestmark = pytest.mark.django_db(transaction=True)


def status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def events(job) -> list[str]:
    return events_of(job)


def test_concurrent_workers_never_run_a_job_twice(worker):
    # Four priority lanes: each claim locks up to its limit in every lane at once.
    jobs = enqueue_many([JobSpec("ping", priority=i % 4 - 1) for i in range(300)])
    procs = [worker("default", args=("--concurrency", "4", "--burst")) for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=90) == 0, proc.output()
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status="succeeded").count() == 300
    starts = (
        JobEvent.objects.filter(event="job.started", job_id__in=[j.pk for j in jobs])
        .values("job_id")
        .annotate(n=Count("id"))
    )
    assert {row["n"] for row in starts} == {1}
    assert len(starts) == 300
    # every job's timeline is gapless: enqueued, started, succeeded
    seqs = [seq for seq, _ in timeline_of(jobs[0])]
    assert seqs == [1, 2, 3]


def test_sigterm_mid_job_requeues_and_exits_143(worker):
    job = enqueue("sleep", {"seconds": 60, "emit_every": 0.2})
    proc = worker(env={"CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "0.5"})
    wait_for(lambda: status(job) == "running", message="job running")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 143, proc.output()
    job.refresh_from_db()
    assert job.status == "queued"
    assert job.attempts == 0  # the requeue does not count the attempt
    assert "job.requeued" in events(job)
    assert not Worker.objects.exists()


def test_sigterm_on_a_short_job_lets_it_finish_and_exits_0(worker):
    job = enqueue("sleep", {"seconds": 1.0, "emit_every": 0.2})
    proc = worker(env={"CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "10"})
    wait_for(lambda: status(job) == "running", message="job running")
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()
    assert status(job) == "succeeded"


def test_sigkill_leaves_a_leased_job_that_expires(worker, start_process):
    job = enqueue("sleep", {"seconds": 60, "emit_every": 0.2})
    proc = worker(env={"CONTROLPLANE_LEASE_SECONDS": "1", "CONTROLPLANE_HEARTBEAT_SECONDS": "0.2"})
    wait_for(lambda: status(job) == "running", message="job running")
    proc.signal(signal.SIGKILL)
    proc.wait(timeout=10)
    job.refresh_from_db()
    assert job.status == "running" and job.leased_until is not None
    wait_for(
        lambda: Job.objects.get(pk=job.pk).leased_until < timezone.now(), message="lease expiry"
    )
    reaper = start_process("reaper", "--once")
    assert reaper.wait(timeout=30) == 0, reaper.output()
    job.refresh_from_db()
    assert job.status == "queued"
    assert events(job)[-1] == "job.lease_expired_requeue"


def test_cancel_of_a_running_job_stops_it(worker):
    job = enqueue("sleep", {"seconds": 60, "emit_every": 0.1})
    worker()
    wait_for(
        lambda: JobEvent.objects.filter(job_id=job.pk, event="sleep.tick").exists(), message="ticks"
    )
    assert transitions.cancel_job(job.pk, by="tester", reason="stop")
    after = enqueue("ping")  # the worker's only slot comes back once the cancelled run stops
    wait_for(lambda: status(after) == "succeeded", timeout=20, message="slot freed")
    job.refresh_from_db()
    assert job.status == "cancelled"
    timeline = events(job)
    assert "job.succeeded" not in timeline and "job.failed" not in timeline
    cancelled_at = timeline.index("job.cancelled")
    assert (
        all(e == "sleep.tick" for e in timeline[cancelled_at + 1 :])
        and len(timeline) - cancelled_at <= 2
    )


def test_retryable_failure_backs_off_then_fails(worker):
    job = enqueue("fail", {"message": "boom", "retryable": True}, max_attempts=3)
    worker()
    wait_for(lambda: status(job) == "failed", message="failed after retries")
    timeline = events(job)
    assert timeline.count("job.started") == 3
    assert timeline.count("job.retry_scheduled") == 2
    job.refresh_from_db()
    assert job.error_code == "DiagnosticFailure" and job.error_message == "boom"


def test_non_retryable_failure_fails_at_once(worker):
    job = enqueue("fail", {"message": "nope"}, max_attempts=3)
    worker()
    wait_for(lambda: status(job) == "failed", message="failed")
    assert events(job).count("job.started") == 1


def test_retry_later_does_not_count_attempts(worker):
    job = enqueue("retry_later", {"times": 2, "delay": 0.1})
    worker()
    wait_for(lambda: status(job) == "succeeded", message="succeeded")
    job.refresh_from_db()
    assert events(job).count("job.retry_later") == 2
    assert job.attempts == 1


def test_priority_then_fifo_and_run_after(worker):
    later = enqueue("ping", run_after=timezone.now() + timedelta(hours=1))
    low = enqueue("ping", priority=-5)
    first = enqueue("ping")
    second = enqueue("ping")
    high = enqueue("ping", priority=50)
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=30) == 0
    order = list(
        JobEvent.objects.filter(event="job.started")
        .order_by("ts", "id")
        .values_list("job_id", flat=True)
    )
    assert order == [high.pk, first.pk, second.pk, low.pk]
    assert status(later) == "queued"


def test_unknown_operation_and_expired_jobs_fail_with_codes(worker):
    unknown = Job.objects.create(operation="no.such.op", last_event_seq=0)
    expired = enqueue("ping", expires_at=timezone.now() + timedelta(milliseconds=1))
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=30) == 0
    unknown.refresh_from_db()
    expired.refresh_from_db()
    assert (unknown.status, unknown.error_code) == ("failed", "UnknownOperation")
    assert (expired.status, expired.error_code) == ("failed", "JobExpired")


def test_paused_queue_is_not_claimed(worker):
    Queue.objects.create(name="default", paused=True)
    job = enqueue("ping")
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=30) == 0
    assert status(job) == "queued"


def test_concurrency_cap_holds_across_workers(worker):
    Queue.objects.create(name="capped", concurrency_cap=2)
    jobs = [enqueue("sleep", {"seconds": 0.4}, queue="capped") for _ in range(8)]
    for _ in range(2):
        worker("capped", args=("--concurrency", "3"))
    peak = 0

    def done():
        nonlocal peak
        peak = max(peak, Job.objects.filter(queue="capped", status="running").count())
        return Job.objects.filter(pk__in=[j.pk for j in jobs], status="succeeded").count() == 8

    wait_for(done, timeout=40, interval=0.02, message="capped jobs done")
    assert 1 <= peak <= 2


def test_atomic_operation_writes_commit_with_success_or_not_at_all(worker):
    ok = enqueue("test.atomic", {"queue_name": "atomic-ok"})
    bad = enqueue("test.atomic", {"queue_name": "atomic-bad", "fail": True})
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=30) == 0, proc.output()
    assert status(ok) == "succeeded" and status(bad) == "failed"
    assert Queue.objects.filter(name="atomic-ok").exists()
    assert not Queue.objects.filter(name="atomic-bad").exists()
    if connection.vendor == "postgresql":  # emitted from inside the open transaction: kept
        assert "atomic.wrote" in events(bad)


def test_crashed_child_process_is_replaced_and_its_job_requeued(worker):
    crash = enqueue("test.crash", {"code": 3})
    proc = worker(args=("--processes", "2"), env={"CONTROLPLANE_MAX_LEASE_REQUEUES": "0"})
    wait_for(lambda: status(crash) == "failed", timeout=30, message="crash handled")
    crash.refresh_from_db()
    assert crash.error_code == "LeaseExpired"
    after = enqueue("ping")
    wait_for(lambda: status(after) == "succeeded", timeout=30, message="replacement child works")
    # Children are forked from the warm supervisor, not started as new interpreters.
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 2
    for child in children:
        assert (
            Path(f"/proc/{child}/cmdline").read_bytes()
            == Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        )
    assert "worker.child_died" in proc.output()
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()


def _alive(pid: str) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_children_end_with_a_supervisor_killed_outright(worker):
    """A SIGKILLed supervisor cannot forward a stop: its children must still go (PDEATHSIG)."""
    proc = worker(args=("--processes", "2"))
    wait_for(lambda: Worker.objects.count() == 2, timeout=30, message="both children serving")
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 2
    proc.signal(signal.SIGKILL)
    wait_for(
        lambda: not any(_alive(child) for child in children),
        timeout=30,
        message="the children ended with their supervisor",
    )
