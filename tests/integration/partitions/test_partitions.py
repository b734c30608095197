"""The partitioned events table (PostgreSQL): placement, the cursor, retention by drop, DEFAULT.

Jobs are made with ids of chosen creation times (UUIDv7 heads), so a test
can put them in periods of the past without waiting for one to pass.
"""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from jobs.partitions import (
    DEFAULT_PARTITION,
    attach_partition,
    ensure_partitions,
    event_partitions,
    id_at,
    period_start,
    retire_partitions,
)
from jobs.selectors.jobs import job_events_page
from jobs.transitions import emit_event, retry_job
from workers.config import ReaperConfig
from workers.reaper import Reaper

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps a plain table"),
]

DAY = timedelta(days=1)


def job_id_at(moment: datetime) -> uuid.UUID:
    """A UUIDv7 made at ``moment``: its millisecond, then random bits."""
    rand = int.from_bytes(os.urandom(8)) & ((1 << 62) - 1)
    return uuid.UUID(int=id_at(moment).int | 7 << 76 | 0x8000 << 48 | rand)


def make_job(
    moment: datetime,
    *,
    status: str = "succeeded",
    finished: datetime | None = None,
    events: int = 3,
    parent: Job | None = None,
    **fields,
) -> Job:
    """A job made at ``moment`` with ``events`` events (the first ``job.enqueued``)."""
    done = status in ("succeeded", "failed", "cancelled")
    job = Job.objects.create(
        id=job_id_at(moment),
        operation="ping",
        queue="history",
        status=status,
        created_at=moment,
        finished_at=(finished or moment) if done else None,
        last_event_seq=events,
        parent=parent,
        **fields,
    )
    JobEvent.objects.bulk_create(
        JobEvent(job=job, seq=n, ts=moment, event="job.enqueued" if n == 1 else "step")
        for n in range(1, events + 1)
    )
    return job


def partition_of(job: Job) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT tableoid::regclass::text FROM controlplane_jobevent WHERE job_id = %s",
            [job.pk],
        )
        return {r[0] for r in cursor.fetchall()}


def names() -> set[str]:
    return {p.name for p in event_partitions()}


def past_partitions(days_ago: int, count: int) -> list[str]:
    """Daily partitions for ``count`` days from ``days_ago`` days back (today's exist)."""
    start = period_start(timezone.now(), DAY) - DAY * days_ago
    made = []
    for n in range(count):
        begin = start + DAY * n
        if not any(p.start <= begin < p.end for p in event_partitions()):
            made.append(attach_partition(begin, begin + DAY))
    return made


def test_partitioning_made_partitions_ahead_and_events_land_in_the_current_one():
    now = timezone.now()
    parts = event_partitions()
    assert any(p.start <= now < p.end for p in parts)
    assert parts[-1].end >= now + DAY * 3
    job = enqueue("ping")
    assert partition_of(job) == set()  # job.enqueued is implied, not stored (jobs.timeline)
    emit_event(job.pk, event="t.landed")
    [current] = [p.name for p in parts if p.low <= job.pk < p.high]
    assert partition_of(job) == {current}
    assert [e.seq for e in job_events_page(job.pk)[1]] == [1, 2]


def test_ids_no_range_covers_land_in_default_and_move_when_their_range_is_made():
    far = timezone.now() + DAY * 40
    job = make_job(far, status="queued")
    random_id = Job.objects.create(id=uuid.uuid4(), operation="ping", queue="history")
    JobEvent.objects.create(job=random_id, seq=1, event="job.enqueued")
    assert partition_of(job) == {DEFAULT_PARTITION}
    if random_id.pk > event_partitions()[-1].high:
        assert partition_of(random_id) == {DEFAULT_PARTITION}
    made = attach_partition(period_start(far, DAY), period_start(far, DAY) + DAY)
    assert partition_of(job) == {made}
    assert [e.seq for e in job_events_page(job.pk)[1]] == [1, 2, 3]
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{made}"')


def test_ensure_partitions_catches_up_after_the_reaper_was_away():
    now = timezone.now()
    later = now + DAY * 6
    job = make_job(later, status="queued")  # past the three days ahead: DEFAULT for now
    assert partition_of(job) == {DEFAULT_PARTITION}
    made = ensure_partitions(later)
    assert made >= 3
    [holder] = [p.name for p in event_partitions() if p.low <= job.pk < p.high]
    assert partition_of(job) == {holder}
    assert ensure_partitions(later) == 0  # nothing more to make


def test_the_cursor_reads_one_partition_whichever_it_is(django_assert_max_num_queries):
    made = past_partitions(days_ago=12, count=12)
    assert len(names()) >= 15
    moments = [period_start(timezone.now(), DAY) - DAY * n + timedelta(hours=5) for n in range(12)]
    jobs = [make_job(m, events=5) for m in moments]
    for job in jobs:
        last, events = job_events_page(job.pk, after=2, limit=2)
        assert last == 5 and [e.seq for e in events] == [3, 4]
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT e.seq FROM controlplane_job j LEFT JOIN controlplane_jobevent e "
            "ON e.job_id = j.id AND e.seq > 2 AND e.seq <= 4 WHERE j.id = %s",
            [jobs[7].pk],
        )
        plan = "\n".join(r[0] for r in cursor.fetchall())
    scanned = {n for n in names() | {DEFAULT_PARTITION} if f" on {n} " in plan + " "}
    assert len(scanned) == 1, plan
    assert partition_of(jobs[7]) == scanned
    assert made  # the test made its own past periods


def test_retention_drops_a_partition_and_keeps_the_events_of_jobs_that_outlive_it():
    past_partitions(days_ago=12, count=3)
    cutoff_days = 7
    old = period_start(timezone.now(), DAY) - DAY * 11 + timedelta(hours=2)
    done = [make_job(old, finished=old + timedelta(minutes=1)) for _ in range(5)]
    waiting = make_job(old, status="queued", run_after=timezone.now() + DAY * 30)
    recently_done = make_job(old, status="failed", finished=timezone.now() - DAY)
    parent = make_job(old, finished=old + timedelta(minutes=2))
    child = make_job(old + DAY * 5, finished=old + DAY * 5, parent=parent)
    [period] = [p for p in event_partitions() if p.low <= waiting.pk < p.high]

    result = Reaper(ReaperConfig(retention_days=cutoff_days, retention_batch_size=100)).run_once()

    assert result.errors == 0 and result.partitions_dropped >= 1
    assert period.name not in names()
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [period.name])
        assert cursor.fetchone()[0] is None
    # Survivors: their whole timeline moved to DEFAULT, and it goes on from there.
    for job in (waiting, recently_done):
        assert partition_of(job) == {DEFAULT_PARTITION}
        assert [e.seq for e in job_events_page(job.pk)[1]] == [1, 2, 3]
    # Finished long ago: gone, job rows included, by the retention of the same pass.
    assert not Job.objects.filter(pk__in=[j.pk for j in done]).exists()
    assert not JobEvent.objects.filter(job_id__in=[j.pk for j in done]).exists()
    # A parent stays while its child (made in a later period, inside the retention) does.
    assert Job.objects.filter(pk__in=[parent.pk, child.pk]).count() == 2
    assert partition_of(parent) == {DEFAULT_PARTITION}
    assert [e.seq for e in job_events_page(parent.pk)[1]] == [1, 2, 3]
    # A survivor's next event follows its moved ones, in DEFAULT beside them.
    retry_job(recently_done.pk, reason="again")
    events = job_events_page(recently_done.pk)[1]
    assert [(e.seq, e.event) for e in events][-1] == (4, "job.retried")


def test_a_period_still_inside_the_retention_is_kept():
    past_partitions(days_ago=5, count=1)
    moment = period_start(timezone.now(), DAY) - DAY * 5 + timedelta(hours=1)
    job = make_job(moment, finished=moment)
    before = names()
    result = retire_partitions(timezone.now() - DAY * 7)
    assert result.dropped == 0 and names() == before
    assert partition_of(job) != {DEFAULT_PARTITION}


def test_a_reaper_leaves_the_drop_to_another_that_holds_the_partition_lock():
    import psycopg

    from jobs.partitions import _LOCK_KEY
    from tests.conftest import database_url_for_subprocess

    [old] = past_partitions(days_ago=12, count=1)
    other = psycopg.connect(database_url_for_subprocess().replace("postgres://", "postgresql://"))
    try:
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
            assert retire_partitions(timezone.now() - DAY * 7).dropped == 0
            assert old in names()
    finally:
        other.close()
    assert retire_partitions(timezone.now() - DAY * 7).dropped >= 1
    assert old not in names()
