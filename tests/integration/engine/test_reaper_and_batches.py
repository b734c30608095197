"""The reaper, parent/child coordinators and batch consumers, as real processes."""

from __future__ import annotations

import signal
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import transitions
from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import BatchMessage, Job, JobEvent, Worker
from tests.conftest import wait_for
from workers.config import ReaperConfig
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)


def status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def count(job, event: str) -> int:
    return JobEvent.objects.filter(job_id=job.pk, event=event).count()


def reaper_config(**overrides) -> ReaperConfig:
    base = dict(
        interval_seconds=0.2,
        timeout_seconds=3600,
        stall_seconds=600,
        max_lease_requeues=1,
        worker_timeout_seconds=60,
        retention_days=7,
        retention_batch_size=100,
    )
    return ReaperConfig(**{**base, **overrides})


def test_kill_9_then_requeue_then_fail_after_the_budget(worker, start_process):
    job = enqueue("sleep", {"seconds": 60, "emit_every": 0.2})
    env = {"CONTROLPLANE_LEASE_SECONDS": "1", "CONTROLPLANE_MAX_LEASE_REQUEUES": "1"}
    reaper = start_process("reaper", "--interval", "0.2", env=env)
    first = worker(env=env)
    wait_for(lambda: status(job) == "running", message="running")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    second = worker(env=env)  # starts while the first one's lease runs out
    wait_for(lambda: count(job, "job.lease_expired_requeue") == 1, timeout=20, message="requeued")
    wait_for(lambda: status(job) == "running", message="running again, on the second worker")
    second.signal(signal.SIGKILL)
    second.wait(timeout=10)
    wait_for(lambda: status(job) != "running", timeout=20, message="reaped")
    job.refresh_from_db()
    assert job.status == "failed" and job.error_code == "LeaseExpired"
    assert count(job, "job.lease_expired_requeue") == 1
    assert count(job, "job.lease_expired") == 1
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0


def test_timeout_spares_a_busy_job_and_fails_a_stalled_one():
    worker_row = Worker.objects.create(name="w")
    busy = enqueue("sleep", {"seconds": 1})
    stalled = enqueue("sleep", {"seconds": 1})
    claimed = {
        c.id: c
        for c in claim_jobs(queues=["default"], worker_id=worker_row.id, limit=2, lease_seconds=600)
    }
    past = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk__in=[busy.pk, stalled.pk]).update(started_at=past, last_event_at=past)
    transitions.emit_event(busy.pk, event="still.working", lease_token=claimed[busy.pk].lease_token)
    result = Reaper(reaper_config(timeout_seconds=60, stall_seconds=30)).run_once()
    assert result.timed_out == 1
    assert status(busy) == "running"
    stalled.refresh_from_db()
    assert (stalled.status, stalled.error_code) == ("failed", "JobTimeout")
    assert count(stalled, "job.timeout") == 1


def test_two_reapers_at_once_act_once():
    worker_row = Worker.objects.create(name="w")
    jobs = [enqueue("ping") for _ in range(40)]
    claim_jobs(queues=["default"], worker_id=worker_row.id, limit=40, lease_seconds=600)
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
        leased_until=timezone.now() - timedelta(seconds=1)
    )
    results = []

    def reap():
        results.append(Reaper(reaper_config(max_lease_requeues=3)).run_once())
        connection.close()

    threads = [threading.Thread(target=reap) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.lease_requeued for r in results) == 40
    assert all(count(j, "job.lease_expired_requeue") == 1 for j in jobs)


def test_silent_worker_is_swept_and_its_jobs_requeued():
    stale = Worker.objects.create(name="gone", last_heartbeat=timezone.now() - timedelta(minutes=5))
    job = enqueue("ping")
    claim_jobs(queues=["default"], worker_id=stale.id, limit=1, lease_seconds=600)
    result = Reaper(reaper_config(worker_timeout_seconds=30)).run_once()
    assert result.workers_swept == 1 and result.lease_requeued == 1
    assert status(job) == "queued"
    assert not Worker.objects.filter(pk=stale.pk).exists()


def test_retention_deletes_old_finished_jobs_and_their_events():
    old = enqueue("ping")
    recent = enqueue("ping")
    transitions.cancel_jobs([old.pk, recent.pk])
    Job.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=30))
    result = Reaper(reaper_config(retention_days=7)).run_once()
    assert result.jobs_deleted == 1
    assert not Job.objects.filter(pk=old.pk).exists()
    assert not JobEvent.objects.filter(job_id=old.pk).exists()
    assert Job.objects.filter(pk=recent.pk).exists()


def test_fanout_of_hundreds_of_batches_closes_the_parent_once(worker):
    parent = enqueue("fanout", {"batches": 200})
    worker("default")
    for _ in range(2):
        worker("default.batch", args=("--concurrency", "4"))
        worker("default.write", args=("--concurrency", "2"))
    wait_for(lambda: status(parent) == "succeeded", timeout=90, message="fanout done")
    parent.refresh_from_db()
    assert (parent.progress_current, parent.progress_total) == (200, 200)
    assert count(parent, "job.succeeded") == 1
    assert count(parent, "batch.written") == 200
    assert count(parent, "job.deferred") == 1
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()


def test_a_failed_batch_fails_the_parent(worker):
    parent = enqueue("fanout", {"batches": 10, "fail_batch": 3})
    env = {"CONTROLPLANE_BATCH_MAX_ATTEMPTS": "2"}
    worker("default", env=env)
    worker("default.batch", env=env)
    worker("default.write", env=env)
    wait_for(lambda: status(parent) == "failed", timeout=60, message="parent failed")
    parent.refresh_from_db()
    assert parent.error_code == "BatchFailed"
    assert "Batch 3" in parent.error_message
    wait_for(
        lambda: not BatchMessage.objects.filter(parent_id=parent.pk).exists(), message="discarded"
    )


def test_cancelling_a_parent_stops_its_batches_and_children(worker):
    parent = enqueue("fanout", {"batches": 50, "batch_sleep": 0.2})
    child = enqueue("sleep", {"seconds": 30}, queue="children", parent=parent.pk)
    worker("default")
    wait_for(
        lambda: BatchMessage.objects.filter(parent_id=parent.pk).exists(), message="dispatched"
    )
    batch = worker("default.batch")
    wait_for(lambda: count(parent, "batch.dispatched") == 1, message="dispatch event")
    transitions.cancel_job(parent.pk, by="tester")
    assert status(parent) == "cancelled" and status(child) == "cancelled"
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()
    written_before = count(parent, "batch.written")
    write = worker("default.write")
    batch.signal(signal.SIGTERM)
    batch.wait(timeout=20)
    write.signal(signal.SIGTERM)
    write.wait(timeout=20)
    assert count(parent, "batch.written") == written_before
    assert count(parent, "job.succeeded") == 0


def test_child_of_a_cancelled_parent_is_cancelled_at_claim(worker):
    parent = enqueue("sleep", {"seconds": 30}, queue="parents")
    child = enqueue("ping", parent=parent.pk)
    # Cancel the parent alone, bypassing the cascade, as if the child were claimed in between.
    transitions.move(
        target=transitions.CANCELLED,
        job_ids=[parent.pk],
        event=transitions.Event("job.cancelled"),
        assign={"finished_at": timezone.now()},
    )
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=30) == 0
    assert status(child) == "cancelled"
    assert count(child, "job.succeeded") == 0
