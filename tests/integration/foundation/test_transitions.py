"""Every transition through the function that performs it, on PostgreSQL and SQLite.

Jobs are put in their source state through the public functions only
(enqueue -> claim_jobs -> ...); nothing here writes a status by hand.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from jobs.claims import Completion, complete_jobs
from jobs.exceptions import IllegalTransition, JobNotFound, LeaseLost
from jobs.models import Job, JobEvent
from jobs.operations import registry
from jobs.rescues import fail_timed_out, requeue_expired_leases
from jobs.states import ALLOWED
from jobs.transitions import (
    cancel_job,
    cancel_jobs,
    complete_job,
    defer_job,
    emit_event,
    fail_job,
    requeue_job,
    retry_job,
    retry_job_later,
    retry_jobs,
)
from tests.factories import (
    assert_consistent,
    cancelled,
    claim,
    context,
    failed,
    fresh,
    queued,
    refused,
    running,
    snapshot,
    succeeded,
)

pytestmark = pytest.mark.django_db


# --- sources ------------------------------------------------------------------


def _src_queued():
    return queued(), None


def _src_running():
    return running(max_attempts=3)  # so a retryable failure has attempts left


def _src_failed():
    return failed(), None


def _src_cancelled():
    return cancelled(), None


SOURCES = {
    "queued": _src_queued,
    "running": _src_running,
    "failed": _src_failed,
    "cancelled": _src_cancelled,
}


# --- the functions that perform each allowed move ------------------------------


def _claim(job, held):
    claim(job)


def _cancel(job, held):
    assert cancel_job(job.pk, by="tester", reason="because") is True


def _complete(job, held):
    complete_job(job.pk, lease_token=held.lease_token, result={"pong": True})


def _complete_many(job, held):
    assert complete_jobs([Completion(job.pk, held.lease_token, result=[1])]) == [job.pk]


def _fail(job, held):
    status = fail_job(job.pk, lease_token=held.lease_token, error_code="E", error_message="m")
    assert status == "failed"


def _lease_budget_spent(job, held):
    # Claimed again with a lease already in the past, under a budget of 0 requeues.
    requeue_job(job.pk, lease_token=held.lease_token)
    claim(job, lease_seconds=-1)
    assert requeue_expired_leases(max_requeues=0) == ([], [job.pk])


def _timeout(job, held):
    assert fail_timed_out(timeout_seconds=-1, stall_seconds=-1) == [job.pk]


def _retry_later(job, held):
    retry_job_later(job.pk, lease_token=held.lease_token, reason="busy", delay_seconds=60)


def _retryable_failure(job, held):
    status = fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="E",
        error_message="flaky",
        retryable=True,
        backoff_seconds=60,
    )
    assert status == "queued"


def _requeue(job, held):
    requeue_job(job.pk, lease_token=held.lease_token, reason="shutdown")


def _lease_expired_requeue(job, held):
    requeue_job(job.pk, lease_token=held.lease_token)
    claim(job, lease_seconds=-1)
    assert requeue_expired_leases(max_requeues=3) == ([job.pk], [])


def _retry(job, held):
    retry_job(job.pk, by="operator")


def _retry_many(job, held):
    assert retry_jobs([job.pk]) == [job.pk]


CASES = [
    ("queued", "running", _claim, "job.started"),
    ("queued", "cancelled", _cancel, "job.cancelled"),
    ("running", "succeeded", _complete, "job.succeeded"),
    ("running", "succeeded", _complete_many, "job.succeeded"),
    ("running", "failed", _fail, "job.failed"),
    ("running", "failed", _lease_budget_spent, "job.lease_expired"),
    ("running", "failed", _timeout, "job.timeout"),
    ("running", "queued", _retry_later, "job.retry_later"),
    ("running", "queued", _retryable_failure, "job.retry_scheduled"),
    ("running", "queued", _requeue, "job.requeued"),
    ("running", "queued", _lease_expired_requeue, "job.lease_expired_requeue"),
    ("running", "cancelled", _cancel, "job.cancelled"),
    ("failed", "queued", _retry, "job.retried"),
    ("failed", "queued", _retry_many, "job.retried"),
    ("cancelled", "queued", _retry, "job.retried"),
    ("cancelled", "queued", _retry_many, "job.retried"),
]


def test_cases_cover_every_allowed_pair():
    assert {(s, t) for s, t, _, _ in CASES} == {(a.value, b.value) for a, b in ALLOWED}


@pytest.mark.parametrize(
    "source,target,perform,event", CASES, ids=[f"{s}-{t}-{f.__name__[1:]}" for s, t, f, _ in CASES]
)
def test_allowed_transition(source, target, perform, event):
    job, held = SOURCES[source]()
    assert fresh(job).status == source
    before = assert_consistent(job)

    perform(job, held)

    after_job = fresh(job)
    assert after_job.status == target
    events = assert_consistent(job)
    # The move wrote exactly its event, right after the last one (no gaps),
    # and the row's bookkeeping points at it: status and event committed together.
    assert events[-1] == (after_job.last_event_seq, event)
    assert events[: len(before)] == before
    if perform not in (_lease_budget_spent, _lease_expired_requeue):
        assert len(events) == len(before) + 1
    if target in ("succeeded", "failed", "cancelled"):
        assert after_job.finished_at is not None
        assert after_job.leased_until is None
    if target == "running":
        assert after_job.lease_token is not None and after_job.leased_until > timezone.now()
        assert after_job.attempts == 1 and after_job.started_at is not None
    if target == "queued":
        assert after_job.lease_token is None and after_job.finished_at is None


def test_claim_then_run_then_complete_gives_a_full_timeline():
    job, held = running()
    op = registry.get(job.operation)
    result = op.execute(context(held), held.payload)
    complete_job(job.pk, lease_token=held.lease_token, result=result)
    job = fresh(job)
    assert job.result == {"pong": True}
    assert [e for _, e in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        "job.succeeded",
    ]
    started = JobEvent.objects.get(job=job, event="job.started")
    assert started.fields["attempt"] == 1


# --- the event is written in the same transaction as the status ----------------


def _squat_next_seq(job):
    """Take the seq the next event would get, so writing that event must fail."""
    JobEvent.objects.create(job_id=job.pk, seq=fresh(job).last_event_seq + 1, event="squatter")


@pytest.mark.parametrize(
    "source,perform",
    [
        ("queued", _claim),
        ("queued", _cancel),
        ("running", _complete),
        ("running", _fail),
        ("running", _requeue),
        ("failed", _retry),
    ],
    ids=["claim", "cancel", "complete", "fail", "requeue", "retry"],
)
def test_status_does_not_change_when_its_event_cannot_be_written(source, perform):
    job, held = SOURCES[source]()
    _squat_next_seq(job)
    before = snapshot(job)
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            perform(job, held)
    assert snapshot(job) == before
    assert fresh(job).status == source


# --- refused moves change nothing -----------------------------------------------


def test_complete_a_queued_job_isrefused():
    job = queued()
    error = refused(job, lambda: complete_job(job.pk, lease_token=None), IllegalTransition)
    assert (error.source, error.target, error.job_id) == ("queued", "succeeded", job.pk)
    assert "cannot move from 'queued' to 'succeeded'" in str(error)
    # With a token the caller never held, it is a lost lease.
    refused(job, lambda: complete_job(job.pk, lease_token=uuid.uuid4()), LeaseLost)


@pytest.mark.parametrize(
    "make", [succeeded, failed, cancelled], ids=["succeeded", "failed", "cancelled"]
)
def test_finished_jobs_cannot_be_completed_failed_or_requeued(make):
    job = make()
    refused(job, lambda: complete_job(job.pk, lease_token=None), IllegalTransition)
    refused(
        job,
        lambda: fail_job(job.pk, lease_token=None, error_code="E", error_message="m"),
        IllegalTransition,
    )
    refused(job, lambda: requeue_job(job.pk, lease_token=None), IllegalTransition)


def test_retry_a_succeeded_job_isrefused():
    job = succeeded()
    error = refused(job, lambda: retry_job(job.pk), IllegalTransition)
    assert (error.source, error.target) == ("succeeded", "queued")
    assert retry_jobs([job.pk]) == []
    assert fresh(job).status == "succeeded"


def test_retry_an_active_job_isrefused():
    job = queued()
    refused(job, lambda: retry_job(job.pk), IllegalTransition)
    job, _ = running()
    refused(job, lambda: retry_job(job.pk), IllegalTransition)


def test_requeue_a_queued_job_isrefused():
    job = queued()
    error = refused(job, lambda: requeue_job(job.pk, lease_token=None), IllegalTransition)
    assert (error.source, error.target) == ("queued", "queued")


@pytest.mark.parametrize(
    "make", [succeeded, failed, cancelled], ids=["succeeded", "failed", "cancelled"]
)
def test_cancel_a_finished_job_is_a_no_op(make):
    job = make()
    before = snapshot(job)
    assert cancel_job(job.pk) is False
    assert cancel_jobs([job.pk]) == []
    assert snapshot(job) == before


def test_unknown_job_is_not_found():
    missing = uuid.uuid4()
    with pytest.raises(JobNotFound):
        cancel_job(missing)
    with pytest.raises(JobNotFound):
        retry_job(missing)
    with pytest.raises(JobNotFound):
        complete_job(missing, lease_token=uuid.uuid4())
    with pytest.raises(JobNotFound):
        emit_event(missing, event="x.y")
    assert not Job.objects.filter(pk=missing).exists()
    assert not JobEvent.objects.filter(job_id=missing).exists()


@pytest.mark.parametrize("result", [5, 2.5, "done", True, [1, "a"], {"a": {"b": 1}}, None])
def test_any_json_result_is_stored_and_read_back(result):
    job, held = running()
    complete_job(job.pk, lease_token=held.lease_token, result=result)
    assert fresh(job).result == result
    other, other_held = running("fanout", payload={"batches": 1})
    defer_job(other.pk, lease_token=other_held.lease_token, result=result)
    assert fresh(other).result == result
