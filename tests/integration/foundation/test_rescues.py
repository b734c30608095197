"""The reaper's rescues: expired leases, gone workers, timed-out jobs."""

from __future__ import annotations

import time
import uuid

import pytest

from jobs.claims import claim_jobs
from jobs.exceptions import LeaseLost
from jobs.models import Job
from jobs.operations import registry
from jobs.rescues import fail_timed_out, requeue_expired_leases
from jobs.transitions import complete_job, defer_job, emit_event
from tests.factories import assert_consistent, claim, context, fresh, queued, running

pytestmark = pytest.mark.django_db


# --- rescues ---------------------------------------------------------------------------


def test_expired_leases_are_requeued_under_the_budget_then_failed():
    job, held = running(lease_seconds=-1)
    healthy, _ = running(lease_seconds=300)
    assert requeue_expired_leases(max_requeues=1) == ([job.pk], [])
    job_row = fresh(job)
    assert (job_row.status, job_row.lease_requeues, job_row.attempts) == ("queued", 1, 0)
    assert fresh(healthy).status == "running"

    claim(job, lease_seconds=-1)
    assert requeue_expired_leases(max_requeues=1) == ([], [job.pk])
    job_row = fresh(job)
    assert job_row.status == "failed" and job_row.error_code == "LeaseExpired"
    assert [e for _, e in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        "job.lease_expired_requeue",
        "job.started",
        "job.lease_expired",
    ]
    assert fresh(healthy).status == "running"
    # The old holder cannot finish it.
    with pytest.raises(LeaseLost):
        complete_job(job.pk, lease_token=held.lease_token)


def test_jobs_of_a_gone_worker_are_rescued_even_with_a_valid_lease():
    gone_worker = uuid.uuid4()
    job = queued()
    claim_jobs(queues=[job.queue], worker_id=gone_worker, limit=1, lease_seconds=300)
    other, _ = running(lease_seconds=300)
    assert requeue_expired_leases(max_requeues=3, worker_ids=[gone_worker]) == ([job.pk], [])
    assert fresh(job).status == "queued"
    assert fresh(other).status == "running"


def test_fail_timed_out_spares_jobs_with_recent_events():
    stalled, _ = running()
    lively, lively_held = running()
    time.sleep(0.4)  # the stalled job's last event is now older than 0.3 s, always
    emit_event(lively.pk, event="work.tick", lease_token=lively_held.lease_token)
    # Under the timeout nobody is touched, stalled or not.
    assert fail_timed_out(timeout_seconds=3600, stall_seconds=0) == []

    assert fail_timed_out(timeout_seconds=0, stall_seconds=0.3) == [stalled.pk]
    stalled = fresh(stalled)
    assert stalled.status == "failed" and stalled.error_code == "JobTimeout"
    assert assert_consistent(stalled)[-1][1] == "job.timeout"
    assert fresh(lively).status == "running"


def test_a_deferred_parent_is_held_by_its_batches_not_by_a_lease():
    coordinator_worker = uuid.uuid4()
    parent = queued("fanout", payload={"batches": 2})
    held = claim(parent, lease_seconds=300, worker_id=coordinator_worker)
    outcome = registry.get("fanout").execute(context(held), held.payload)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    row = fresh(parent)
    assert (row.status, row.lease_token, row.leased_until) == ("running", None, None)
    assert row.worker_id is None
    # Neither an expiry nor the sweep of the worker that ran the coordinator touches it,
    assert requeue_expired_leases(max_requeues=3, worker_ids=[coordinator_worker]) == ([], [])
    # not even a row deferred before worker_id was cleared on defer.
    Job.objects.filter(pk=parent.pk).update(worker_id=coordinator_worker)
    assert requeue_expired_leases(max_requeues=0, worker_ids=[coordinator_worker]) == ([], [])
    assert fresh(parent).status == "running"
    # The hard timeout with its stall grace still applies.
    assert fail_timed_out(timeout_seconds=0, stall_seconds=0) == [parent.pk]
    assert fresh(parent).error_code == "JobTimeout"
    assert_consistent(parent)
