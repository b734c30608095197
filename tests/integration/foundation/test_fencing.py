"""Lease fencing: a worker that lost its job writes nothing over it."""

from __future__ import annotations

import pytest

from jobs.exceptions import JobCancelled, LeaseLost
from jobs.models import JobEvent
from jobs.transitions import (
    cancel_job,
    complete_job,
    defer_job,
    emit_event,
    fail_job,
    requeue_job,
    retry_job_later,
)
from tests.factories import assert_consistent, claim, context, fresh, refused, running, snapshot

pytestmark = pytest.mark.django_db


# --- lease fencing ---------------------------------------------------------------


def test_a_stale_lease_token_changes_nothing():
    job, first = running()
    requeue_job(job.pk, lease_token=first.lease_token)  # e.g. the lease expired
    second = claim(job)
    assert second.lease_token != first.lease_token
    stale = first.lease_token

    refused(job, lambda: complete_job(job.pk, lease_token=stale, result=1), LeaseLost)
    refused(
        job,
        lambda: fail_job(job.pk, lease_token=stale, error_code="E", error_message="m"),
        LeaseLost,
    )
    refused(
        job,
        lambda: fail_job(
            job.pk,
            lease_token=stale,
            error_code="E",
            error_message="m",
            retryable=True,
            backoff_seconds=1,
        ),
        LeaseLost,
    )
    refused(job, lambda: emit_event(job.pk, event="x.tick", lease_token=stale), LeaseLost)
    refused(
        job,
        lambda: retry_job_later(job.pk, lease_token=stale, reason="r", delay_seconds=1),
        LeaseLost,
    )
    refused(job, lambda: requeue_job(job.pk, lease_token=stale), LeaseLost)
    refused(job, lambda: defer_job(job.pk, lease_token=stale), LeaseLost)
    error = refused(job, lambda: complete_job(job.pk, lease_token=stale), LeaseLost)
    assert error.status == "running" and str(job.pk) in str(error)

    # The current holder still finishes it.
    complete_job(job.pk, lease_token=second.lease_token, result=2)
    assert fresh(job).status == "succeeded" and fresh(job).result == 2
    assert_consistent(job)


def test_emit_on_a_cancelled_job_raises_job_cancelled():
    job, held = running()
    ctx = context(held)
    assert ctx.emit("work.step", "one") == 3
    assert cancel_job(job.pk) is True
    before = snapshot(job)
    with pytest.raises(JobCancelled):
        emit_event(job.pk, event="work.step", lease_token=held.lease_token)
    with pytest.raises(JobCancelled):
        ctx.emit("work.step", "two")
    assert ctx.cancelled
    assert snapshot(job) == before
    # A late success or failure never overwrites cancelled.
    refused(job, lambda: complete_job(job.pk, lease_token=held.lease_token), LeaseLost)
    refused(
        job,
        lambda: fail_job(job.pk, lease_token=held.lease_token, error_code="E", error_message="m"),
        LeaseLost,
    )


def test_a_cancelled_job_is_never_put_back_on_the_queue_by_its_worker():
    job, held = running("fail", payload={"message": "boom"}, max_attempts=5)
    assert cancel_job(job.pk) is True
    token = held.lease_token
    refused(
        job,
        lambda: fail_job(
            job.pk,
            lease_token=token,
            error_code="E",
            error_message="m",
            retryable=True,
            backoff_seconds=1,
        ),
        LeaseLost,
    )
    refused(
        job,
        lambda: retry_job_later(job.pk, lease_token=token, reason="r", delay_seconds=1),
        LeaseLost,
    )
    refused(job, lambda: requeue_job(job.pk, lease_token=token), LeaseLost)
    refused(job, lambda: defer_job(job.pk, lease_token=token), LeaseLost)
    assert fresh(job).status == "cancelled"


def test_emit_with_progress_updates_the_job():
    job, held = running()
    seq = emit_event(
        job.pk,
        event="work.tick",
        message="half",
        level="warning",
        fields={"_progress_current": 5, "_progress_total": 10, "extra": "x"},
        lease_token=held.lease_token,
    )
    job = fresh(job)
    assert seq == job.last_event_seq == 3
    assert (job.progress_current, job.progress_total) == (5, 10)
    event = JobEvent.objects.get(job=job, seq=seq)
    assert (event.event, event.level, event.message) == ("work.tick", "warning", "half")
    assert event.fields["extra"] == "x"
