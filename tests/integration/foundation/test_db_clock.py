"""On PostgreSQL every time that coordinates processes is the database's, not the caller's.

The calling process's clock is set an hour ahead (``django.utils.timezone.now``,
what every module reads): enqueue, claim, lease extension, progress events,
retry backoff, completion, cancellation and the reaper's rescues still write
the database's time (checked against ``clock_timestamp()`` around each
step). The process-level proof, with real workers and a reaper under
faketime, is tests/integration/engine/test_clock_skew.py.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.claims import Completion, claim_jobs, complete_jobs, extend_leases
from jobs.models import Job, JobEvent
from jobs.rescues import requeue_expired_leases
from jobs.transitions import cancel_job, emit_event, fail_job
from tests.factories import queued

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite is one machine: its clock is ours"
    ),
]

OFF = timedelta(hours=1)


def db_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@pytest.fixture
def clock_an_hour_ahead(monkeypatch):
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + OFF)


# jobs.clock.db_now (enqueue's times) is the database's clock carried on this
# process's monotonic clock, behind by up to a round trip: a second's slack, not an hour.
SLACK = timedelta(seconds=1)


def near(value: datetime | None, low: datetime, high: datetime, plus: float = 0.0) -> bool:
    shift = timedelta(seconds=plus)
    return value is not None and low + shift - SLACK <= value <= high + shift + SLACK


def test_an_hour_ahead_changes_no_time_that_coordinates(clock_an_hour_ahead):
    low = db_clock()
    job = queued("ping", max_attempts=3)
    held = claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert [h.id for h in held] == [job.pk], "a job enqueued now is claimable now"
    emit_event(job.pk, event="step", lease_token=held[0].lease_token)
    assert (
        extend_leases(
            worker_id=uuid.uuid4(), held=[(job.pk, held[0].lease_token)], lease_seconds=60
        )
        == set()
    )
    high = db_clock()
    row = Job.objects.get(pk=job.pk)
    assert near(row.created_at, low, high) and near(row.run_after, low, high)
    assert near(row.started_at, low, high) and near(row.leased_until, low, high, plus=60)

    low = db_clock()
    fail_job(
        job.pk,
        lease_token=held[0].lease_token,
        error_code="Boom",
        error_message="boom",
        retryable=True,
        backoff_seconds=5,
    )
    high = db_clock()
    retried = Job.objects.get(pk=job.pk)
    assert retried.status == "queued" and near(retried.run_after, low, high, plus=5)

    other = queued("ping")
    [again] = claim_jobs(queues=[other.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert complete_jobs([Completion(other.pk, again.lease_token, result=1)]) == [other.pk]
    third = queued("ping")
    cancel_job(third.pk)
    fourth = queued("ping")
    claim_jobs(queues=[fourth.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=0.05)
    assert fourth.pk not in requeue_expired_leases(max_requeues=5)[0], "not an hour early"
    time.sleep(0.1)
    requeued, _ = requeue_expired_leases(max_requeues=5)
    assert fourth.pk in requeued, "not an hour late"
    high = db_clock()
    for pk in (other.pk, third.pk):
        assert near(Job.objects.get(pk=pk).finished_at, low, high)

    # Every event's ts is the database's, in seq order.
    for pk in (job.pk, other.pk, third.pk, fourth.pk):
        times = list(
            JobEvent.objects.filter(job_id=pk).order_by("seq").values_list("ts", flat=True)
        )
        assert times == sorted(times)
        assert all(t <= high + SLACK for t in times), "an event stamped with the caller's clock"
