"""Cancel cascade, bulk completion, retries and backoff."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.claims import Completion, claim_jobs, complete_jobs
from jobs.enqueue import enqueue
from jobs.exceptions import JobCancelled
from jobs.models import BatchMessage, JobEvent
from jobs.operations import registry
from jobs.transitions import (
    cancel_job,
    cancel_jobs,
    defer_job,
    emit_event,
    fail_job,
    requeue_job,
    retry_job,
    retry_job_later,
)
from tests.factories import (
    assert_consistent,
    claim,
    context,
    failed,
    fresh,
    queued,
    running,
    snapshot,
    succeeded,
    unique_queue,
)

pytestmark = pytest.mark.django_db


# --- cancel cascade ----------------------------------------------------------------


def test_cancel_cascades_to_the_whole_tree_and_drops_its_batch_messages():
    parent, parent_held = running("fanout", payload={"batches": 3})
    # The coordinator dispatches its batches and returns deferred, as a worker would run it.
    outcome = registry.get("fanout").execute(context(parent_held), parent_held.payload)
    assert outcome.deferred
    defer_job(parent.pk, lease_token=parent_held.lease_token, result=outcome.result)
    assert BatchMessage.objects.filter(parent_id=parent.pk).count() == 3

    child = queued(parent=parent.pk)
    # A running descendant that is itself a coordinator with pending batches.
    running_child, child_held = running("fanout", payload={"batches": 2}, parent=parent.pk)
    registry.get("fanout").execute(context(child_held), child_held.payload)
    assert BatchMessage.objects.filter(parent_id=running_child.pk).count() == 2
    grandchild, grandchild_held = running(parent=running_child.pk)
    queued_grandchild = queued(parent=child.pk)
    done_child = succeeded(parent=parent.pk)

    # An unrelated coordinator keeps its messages.
    other, other_held = running("fanout", payload={"batches": 2})
    registry.get("fanout").execute(context(other_held), other_held.payload)

    moved = cancel_jobs([parent.pk], by="ops", reason="stop it")

    tree = [parent, child, running_child, grandchild, queued_grandchild]
    assert set(moved) == {j.pk for j in tree}
    for job in tree:
        job = fresh(job)
        assert job.status == "cancelled", job
        assert job.finished_at is not None
        events = assert_consistent(job)
        assert events[-1][1] == "job.cancelled"
    cascade = JobEvent.objects.get(job=grandchild.pk, event="job.cancelled")
    assert cascade.fields.get("cascade") is True
    root_event = JobEvent.objects.get(job=parent.pk, event="job.cancelled")
    assert root_event.fields == {"by": "ops", "reason": "stop it"}

    assert fresh(done_child).status == "succeeded"
    assert not BatchMessage.objects.filter(parent_id__in=[j.pk for j in tree]).exists()
    assert BatchMessage.objects.filter(parent_id=other.pk).count() == 2
    assert fresh(other).status == "running"

    # The workers of the running descendants find out at their next emit.
    with pytest.raises(JobCancelled):
        emit_event(grandchild.pk, event="x", lease_token=grandchild_held.lease_token)
    with pytest.raises(JobCancelled):
        emit_event(running_child.pk, event="x", lease_token=child_held.lease_token)

    # Idempotent: a second cancel changes nothing.
    counts = {j.pk: fresh(j).last_event_seq for j in tree}
    assert cancel_job(parent.pk) is False
    assert {j.pk: fresh(j).last_event_seq for j in tree} == counts


# --- complete_jobs in bulk ------------------------------------------------------------


def test_complete_jobs_moves_only_jobs_whose_token_is_current():
    queue = unique_queue()
    jobs = [enqueue("ping", {}, queue=queue) for _ in range(4)]
    held = {
        c.id: c
        for c in claim_jobs(queues=[queue], worker_id=uuid.uuid4(), limit=4, lease_seconds=30)
    }
    assert set(held) == {j.pk for j in jobs}
    ok1, ok2, stale, gone = jobs
    requeue_job(stale.pk, lease_token=held[stale.pk].lease_token)
    reclaimed = claim(stale)
    cancel_job(gone.pk)
    before = {j.pk: snapshot(j) for j in (stale, gone)}

    moved = complete_jobs(
        [
            Completion(ok1.pk, held[ok1.pk].lease_token, result={"n": 1}, progress=(3, 3)),
            Completion(ok2.pk, held[ok2.pk].lease_token, result=None),
            Completion(stale.pk, held[stale.pk].lease_token, result={"n": 3}),
            Completion(gone.pk, held[gone.pk].lease_token, result={"n": 4}),
        ]
    )

    assert set(moved) == {ok1.pk, ok2.pk}
    assert fresh(ok1).result == {"n": 1}
    assert (fresh(ok1).progress_current, fresh(ok1).progress_total) == (3, 3)
    for job in (ok1, ok2):
        assert fresh(job).status == "succeeded"
        assert assert_consistent(job)[-1][1] == "job.succeeded"
    assert {j.pk: snapshot(j) for j in (stale, gone)} == before
    assert fresh(stale).lease_token == reclaimed.lease_token
    assert complete_jobs([]) == []


# --- retries --------------------------------------------------------------------------


def test_retry_later_does_not_count_the_attempt_and_waits():
    job, held = running()
    assert fresh(job).attempts == 1
    retry_job_later(job.pk, lease_token=held.lease_token, reason="busy", delay_seconds=120)
    job = fresh(job)
    assert job.status == "queued" and job.attempts == 0
    assert job.run_after > timezone.now() + timedelta(seconds=100)
    assert claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30) == []
    event = JobEvent.objects.get(job=job, event="job.retry_later")
    assert event.fields == {
        "reason": "busy",
        "delay_seconds": 120,
        "retry_laters": 1,
        "max_retry_later": 100,
    }


def test_retryable_failure_with_attempts_left_is_scheduled_again():
    job, held = running("fail", payload={"message": "boom"}, max_attempts=2)
    status = fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="DiagnosticFailure",
        error_message="flaky",
        retryable=True,
        backoff_seconds=30,
    )
    assert status == "queued"
    job = fresh(job)
    assert job.status == "queued" and job.attempts == 1
    assert job.run_after > timezone.now() + timedelta(seconds=20)
    assert job.error_code == "DiagnosticFailure" and job.finished_at is None
    events = assert_consistent(job)
    assert events[-1][1] == "job.retry_scheduled"
    assert JobEvent.objects.get(job=job, event="job.retry_scheduled").level == "warning"
    assert claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30) == []


def test_retryable_failure_on_the_last_attempt_fails():
    job, held = running("fail", payload={"message": "boom"}, max_attempts=2)
    fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="E",
        error_message="flaky",
        retryable=True,
        backoff_seconds=0,
    )
    second = claim(job)
    assert second.attempt == 2
    status = fail_job(
        job.pk,
        lease_token=second.lease_token,
        error_code="E",
        error_message="again",
        retryable=True,
        backoff_seconds=0,
    )
    assert status == "failed"
    job = fresh(job)
    assert job.status == "failed" and job.finished_at is not None
    assert job.error_message == "again"
    assert [e for _, e in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        "job.retry_scheduled",
        "job.started",
        "job.failed",
    ]


def test_non_retryable_failure_fails_even_with_attempts_left():
    job, held = running("fail", payload={"message": "boom"}, max_attempts=5)
    assert (
        fail_job(job.pk, lease_token=held.lease_token, error_code="E", error_message="m")
        == "failed"
    )
    assert fresh(job).status == "failed"


def test_operator_retry_resets_the_budget():
    job = failed(max_attempts=1)
    retry_job(job.pk, by="me", reason="try again")
    job = fresh(job)
    assert (job.status, job.attempts, job.error_code, job.finished_at, job.result) == (
        "queued",
        0,
        "",
        None,
        None,
    )
    held = claim(job)
    assert held.attempt == 1
