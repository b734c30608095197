"""``controlplane_partition_events`` on a populated events table (PostgreSQL): rows, ids,
trigger, and back with ``--undo``."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from jobs.partitions import DEFAULT_PARTITION, event_partitions, is_partitioned
from jobs.selectors.jobs import job_events_page
from jobs.transitions import emit_event
from tests.integration.partitions.test_partitions import make_job, partition_of

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps a plain table"),
]


def partition_events(*args: str) -> str:
    out = StringIO()
    call_command("controlplane_partition_events", *args, stdout=out)
    return out.getvalue()


def snapshot() -> list[tuple]:
    return list(JobEvent.objects.order_by("id").values_list("id", "job_id", "seq", "event"))


def job_foreign_keys() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'controlplane_jobevent'::regclass AND contype = 'f'"
        )
        return cursor.fetchall()


def test_a_populated_table_is_converted_in_place_and_back():
    try:
        assert "is now plain" in partition_events("--undo")
        assert not is_partitioned()
        now = timezone.now()
        current = [enqueue("ping") for _ in range(5)]
        for job in current:  # job.enqueued is implied: give each a stored event to move
            emit_event(job.pk, event="t.current")
        old = make_job(now - timedelta(days=40), events=4)  # before the window: DEFAULT
        legacy = Job.objects.create(id=uuid.uuid4(), operation="ping", queue="history")
        JobEvent.objects.create(job=legacy, seq=1, event="job.enqueued")
        rows = snapshot()
        assert job_foreign_keys() == []  # none on the plain table either (migration 0019)

        assert "is now partitioned" in partition_events()

        assert is_partitioned()
        assert snapshot() == rows  # ids, jobs and seqs as they were
        [today] = [p.name for p in event_partitions() if p.start <= now < p.end]
        assert all(partition_of(job) == {today} for job in current)
        assert partition_of(old) == {DEFAULT_PARTITION}
        assert [e.seq for e in job_events_page(old.pk)[1]] == [1, 2, 3, 4]
        assert [(e.seq, e.event) for e in job_events_page(current[0].pk)[1]] == [
            (1, "job.enqueued"),
            (2, "t.current"),
        ]
        # The identity goes on after the copied ids, and the NOTIFY trigger is back.
        newest = enqueue("ping")
        emit_event(newest.pk, event="t.newest")
        assert JobEvent.objects.get(job_id=newest.pk).id > rows[-1][0]
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'controlplane_jobevent'::regclass"
                " AND tgname = 'controlplane_jobevent_notify'"
            )
            assert cursor.fetchone()[0] == 1
        rows = snapshot()
        # No foreign key to the jobs while partitioned either; an event left without its
        # job is deleted on the way back.
        assert job_foreign_keys() == []
        gone = enqueue("ping")
        emit_event(gone.pk, event="t.orphaned")  # a stored event, about to lose its job
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM controlplane_job WHERE id = %s", [gone.pk])
        assert len(snapshot()) == len(rows) + 1  # its event stays while partitioned

        assert "is now plain" in partition_events("--undo")
        assert "was already plain" in partition_events("--undo")

        assert not is_partitioned() and snapshot() == rows
        assert job_foreign_keys() == []
    finally:
        partition_events()
    assert is_partitioned()
