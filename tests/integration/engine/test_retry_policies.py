"""Retry policies in a real worker process: per-operation backoff, a job's own override,
fail-at-once exceptions and the bound on RetryLaterError, on PostgreSQL and SQLite."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from jobs.retry_policy import RETRY_LATER_LIMIT
from tests.conftest import wait_for
from tests.integration.engine import retry_ops
from tests.integration.engine.conftest import TEST_MODULES
from tests.integration.timelines import events_of

pytestmark = pytest.mark.django_db(transaction=True)

ENV = {"CONTROLPLANE_OPERATION_MODULES": f"{TEST_MODULES},{retry_ops.MODULE}"}


@pytest.fixture(autouse=True)
def _retry_operations():
    import tests.integration.engine.retry_ops  # noqa: F401 - enqueue checks the registry


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def scheduled_delay(job: Job) -> float:
    """Seconds between the retry_scheduled event and the run_after it set."""
    wait_for(lambda: "job.retry_scheduled" in events_of(job), message="retry scheduled")
    event = JobEvent.objects.get(job=job, event="job.retry_scheduled")
    job.refresh_from_db()
    return (job.run_after - event.ts).total_seconds()


def test_the_operations_policy_sets_the_backoff(worker):
    job = enqueue("test.slow_backoff", queue="retry-slow")
    worker("retry-slow", env=ENV)
    delay = scheduled_delay(job)
    # The global knobs would wait 2 s (RETRY_BACKOFF_SECONDS) at most; the policy 40 s exactly.
    assert 39.5 <= delay <= 40.5
    assert status(job) == "queued"
    assert JobEvent.objects.get(job=job, event="job.retry_scheduled").fields["delay_seconds"] == 40


def test_the_jobs_override_wins_over_the_operations_policy(worker):
    job = enqueue(
        "test.slow_backoff",
        queue="retry-override",
        retry={"backoff_seconds": 90, "backoff_max_seconds": 120, "strategy": "constant"},
    )
    worker("retry-override", env=ENV)
    delay = scheduled_delay(job)
    assert 89.5 <= delay <= 90.5  # jitter stays the operation's 0


def test_fail_on_wins_over_retry_on(worker):
    flaky = enqueue("test.picky", {}, queue="retry-picky")
    broken = enqueue("test.picky", {"broken": True}, queue="retry-picky")
    worker("retry-picky", env=ENV)
    wait_for(lambda: status(flaky) == "failed" and status(broken) == "failed", message="both")
    assert events_of(flaky).count("job.started") == 3
    assert events_of(broken).count("job.started") == 1
    assert "job.retry_scheduled" not in events_of(broken)


def test_retry_later_past_its_bound_fails_the_job_with_the_reason(worker):
    job = enqueue("test.snoozer", queue="retry-snooze")
    worker("retry-snooze", env=ENV)
    wait_for(lambda: status(job) == "failed", message="failed past the bound")
    job.refresh_from_db()
    assert job.error_code == RETRY_LATER_LIMIT
    assert "asked to run later 2 times; the limit is 2 (max_retry_later)" in job.error_message
    assert events_of(job).count("job.retry_later") == 2
    assert job.retry_laters == 2


def test_the_global_bound_applies_and_counts_across_workers(worker):
    job = enqueue("retry_later", {"times": 5, "delay": 0.01}, queue="retry-global")
    first = worker("retry-global", env={**ENV, "CONTROLPLANE_RETRY_LATER_MAX": "3"})
    wait_for(lambda: status(job) == "failed", message="failed past RETRY_LATER_MAX")
    first.stop()
    job.refresh_from_db()
    assert job.error_code == RETRY_LATER_LIMIT and job.retry_laters == 3
    # An operator's retry gives the count back; the default bound (100) lets it finish.
    from jobs.transitions import retry_job

    retry_job(job.pk)
    job.refresh_from_db()
    assert job.retry_laters == 0
    worker("retry-global", env=ENV)
    wait_for(lambda: status(job) == "succeeded", message="succeeded under the default bound")
