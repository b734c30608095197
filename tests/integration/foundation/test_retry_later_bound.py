"""The bound on RetryLaterError in its transition (``retry_job_later``): by count and by
deadline, the count kept on the job and given back by an operator's retry."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs.models import Job, JobEvent
from jobs.retry_policy import RETRY_LATER_LIMIT, RetryPolicy
from jobs.states import FAILED, QUEUED
from jobs.transitions import retry_job, retry_job_later
from tests.factories import claim, fresh, queued

pytestmark = pytest.mark.django_db


def test_the_count_is_kept_on_the_job_and_the_next_past_it_fails():
    job = queued()
    bound = RetryPolicy(max_retry_later=2)
    for n in (1, 2):
        held = claim(job)
        assert (
            retry_job_later(
                job.pk, lease_token=held.lease_token, reason="busy", delay_seconds=0, policy=bound
            )
            == QUEUED
        )
        assert fresh(job).retry_laters == n
    held = claim(job)
    status = retry_job_later(
        job.pk, lease_token=held.lease_token, reason="busy", delay_seconds=0, policy=bound
    )
    job = fresh(job)
    assert status == FAILED and job.status == "failed"
    assert job.error_code == RETRY_LATER_LIMIT
    assert job.error_message.startswith(
        "The operation asked to run later 2 times; the limit is 2 (max_retry_later)."
    )
    assert job.error_message.endswith("Its last reason: busy")
    assert JobEvent.objects.filter(job=job, event="job.failed").count() == 1

    retry_job(job.pk)  # an operator's retry gives the count back
    assert fresh(job).retry_laters == 0


def test_the_jobs_own_override_sets_the_bound_over_the_operations():
    job = queued(retry={"max_retry_later": 0})
    held = claim(job)
    status = retry_job_later(
        job.pk,
        lease_token=held.lease_token,
        reason="",
        delay_seconds=0,
        policy=RetryPolicy(max_retry_later=50),
    )
    assert status == FAILED and fresh(job).error_code == RETRY_LATER_LIMIT


def test_past_the_deadline_since_enqueue_the_job_fails():
    job = queued()
    Job.objects.filter(pk=job.pk).update(created_at=job.created_at - timedelta(hours=2))
    held = claim(job)
    status = retry_job_later(
        job.pk,
        lease_token=held.lease_token,
        reason="still busy",
        delay_seconds=1,
        policy=RetryPolicy(retry_later_max_seconds=3600),
    )
    job = fresh(job)
    assert status == FAILED and job.error_code == RETRY_LATER_LIMIT
    assert "the limit is 3600 s (retry_later_max_seconds)" in job.error_message


def test_within_the_deadline_the_job_waits():
    job = queued()
    held = claim(job)
    status = retry_job_later(
        job.pk,
        lease_token=held.lease_token,
        reason="",
        delay_seconds=30,
        policy=RetryPolicy(retry_later_max_seconds=3600),
    )
    assert status == QUEUED and fresh(job).status == "queued"
