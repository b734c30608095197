"""Coordinators, batch and write consumers as real ``runworker`` processes, killed and cancelled."""

from __future__ import annotations

import signal

import pytest

from jobs import transitions
from jobs.enqueue import enqueue
from jobs.models import BatchMessage, BatchReceipt, Job, JobEvent, Worker
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def count(job, event: str) -> int:
    return JobEvent.objects.filter(job_id=job.pk, event=event).count()


def kill_9(proc) -> None:
    proc.signal(signal.SIGKILL)
    proc.wait(timeout=10)


def test_kill_9_of_the_coordinators_worker_after_it_deferred_leaves_the_parent_to_its_batches(
    worker, start_process
):
    parent = enqueue("fanout", {"batches": 6})
    env = {"CONTROLPLANE_WORKER_TIMEOUT_SECONDS": "1", "CONTROLPLANE_LEASE_SECONDS": "1"}
    coordinator = worker("default", env=env)
    wait_for(lambda: count(parent, "job.deferred") == 1, message="the coordinator deferred")
    coordinator_row = Worker.objects.get(pid=coordinator.pid).pk
    kill_9(coordinator)
    reaper = start_process("reaper", "--interval", "0.2", env=env)
    # The reaper sweeps the dead worker (and would rescue its jobs) ...
    wait_for(lambda: not Worker.objects.filter(pk=coordinator_row).exists(), message="swept")
    # ... but a deferred parent is held by its batches, not by that worker.
    assert status(parent) == "running"
    worker("default.batch", env=env)
    worker("default.write", env=env)
    wait_for(lambda: status(parent) == "succeeded", timeout=60, message="parent closed")
    parent.refresh_from_db()
    assert (parent.progress_current, parent.progress_total) == (6, 6)
    assert count(parent, "job.started") == 1
    assert count(parent, "batch.dispatched") == 1
    assert count(parent, "job.lease_expired_requeue") == count(parent, "job.lease_expired") == 0
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=30) == 0  # a pass in flight finishes first; 2 busy cores


def test_kill_9_of_a_batch_consumer_then_its_messages_reappear_after_the_visibility_timeout(worker):
    parent = enqueue("fanout", {"batches": 2, "batch_sleep": 3})
    worker("default")
    wait_for(lambda: count(parent, "job.deferred") == 1, message="deferred")
    consumer = worker("default.batch", args=("--concurrency", "2"))
    held = BatchMessage.objects.filter(parent_id=parent.pk, queue="default.batch", attempts=1)
    wait_for(lambda: held.count() == 2, message="both batches claimed")
    kill_9(consumer)
    # Still invisible: nobody released them, the timeout will.
    reappear = max(held.values_list("visible_after", flat=True))
    worker("default.batch", args=("--concurrency", "2"))
    worker("default.write")
    wait_for(lambda: status(parent) == "succeeded", timeout=60, message="parent closed")
    parent.refresh_from_db()
    assert parent.finished_at >= reappear
    assert count(parent, "batch.written") == 2
    assert BatchReceipt.objects.filter(parent_id=parent.pk).count() == 2


def test_a_batch_whose_consumer_dies_on_every_delivery_fails_the_parent(worker):
    env = {"CONTROLPLANE_BATCH_MAX_ATTEMPTS": "1"}
    parent = enqueue("fanout", {"batches": 1, "batch_sleep": 60})
    worker("default", env=env)
    wait_for(lambda: count(parent, "job.deferred") == 1, message="deferred")
    consumer = worker("default.batch", env=env)
    claimed = BatchMessage.objects.filter(parent_id=parent.pk, attempts=1)
    wait_for(claimed.exists, message="the batch claimed")
    kill_9(consumer)
    worker("default.batch", env=env)
    wait_for(lambda: status(parent) == "failed", timeout=30, message="parent failed")
    parent.refresh_from_db()
    assert parent.error_code == "BatchFailed"
    assert "Batch 0 (fanout.batch)" in parent.error_message
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()
    assert count(parent, "batch.written") == 0


def test_each_write_delivered_twice_is_counted_once(worker):
    parent = enqueue("fanout", {"batches": 5})
    worker("default")
    worker("default.batch")
    writes = BatchMessage.objects.filter(parent_id=parent.pk, queue="default.write")
    wait_for(
        lambda: (
            writes.count() == 5
            and not BatchMessage.objects.filter(parent_id=parent.pk, queue="default.batch").exists()
        ),
        message="every batch handed to the write queue",
    )
    for message in list(writes):  # a second delivery of every write
        message.pk = None
        message.save()
    worker("default.write", args=("--concurrency", "3"))
    wait_for(lambda: status(parent) == "succeeded", timeout=60, message="parent closed")
    wait_for(lambda: not BatchMessage.objects.filter(parent_id=parent.pk).exists(), message="acked")
    parent.refresh_from_db()
    assert (parent.progress_current, parent.progress_total) == (5, 5)
    assert count(parent, "batch.written") == 5
    assert count(parent, "job.succeeded") == 1
    assert BatchReceipt.objects.filter(parent_id=parent.pk).count() == 5


def test_cancelling_a_parent_stops_its_remaining_batches_and_its_running_child(worker):
    parent = enqueue("fanout", {"batches": 60, "batch_sleep": 0.2})
    child = enqueue("sleep", {"seconds": 60, "emit_every": 0.2}, queue="kids", parent=parent.pk)
    worker("default")
    kids = worker("kids")
    wait_for(lambda: count(parent, "job.deferred") == 1, message="deferred")
    wait_for(lambda: count(child, "sleep.tick") >= 2, message="the child is running")
    batch = worker("default.batch", args=("--concurrency", "2"))
    write = worker("default.write")
    wait_for(lambda: count(parent, "batch.written") >= 2, message="some batches written")
    assert transitions.cancel_job(parent.pk, by="tester") is True
    written = count(parent, "batch.written")
    assert status(child) == "cancelled"
    # The child's worker is told at its next heartbeat and stops it cooperatively.
    wait_for(lambda: f"job.cancelled job_id={child.pk}" in kids.output(), message="child stopped")
    ticks = count(child, "sleep.tick")
    for proc in (batch, write, kids):
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    assert count(parent, "batch.written") == written < 60
    assert count(child, "sleep.tick") == ticks
    assert status(parent) == status(child) == "cancelled"
    assert count(parent, "job.succeeded") == count(child, "job.succeeded") == 0
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()
