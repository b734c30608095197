"""Invariants the database itself enforces, and the SQLite settings that make it a queue."""

from __future__ import annotations

import io
import threading
import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from django_controlplane.testing import drain_jobs
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent
from jobs.transitions import emit_event
from tests.integration.timelines import timeline_of
from workers.reaper import delete_finished_jobs


def _raw_job(**columns) -> None:
    """Insert a job row with raw SQL: no model validation, only the database's checks."""
    values = {
        "id": uuid.uuid4().hex,
        "operation": "ping",
        "queue": "constraints",
        "payload": "{}",
        "status": "queued",
        "priority": 0,
        "run_after": timezone.now(),
        "attempts": 0,
        "max_attempts": 1,
        "lease_requeues": 0,
        "progress_current": 0,
        "error_code": "",
        "error_message": "",
        "created_at": timezone.now(),
        "last_event_seq": 0,
    }
    values.update(columns)
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO controlplane_job ({names}) VALUES ({marks})", list(values.values())
        )


@pytest.mark.django_db
def test_a_valid_raw_row_is_accepted():
    """The baseline the refusals below differ from by one column."""
    _raw_job()
    assert Job.objects.filter(queue="constraints").count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "columns,constraint",
    [
        ({"priority": 101}, "job_priority_range"),
        ({"priority": -101}, "job_priority_range"),
        ({"status": "done"}, "job_status_valid"),
        ({"status": "succeeded"}, "job_terminal_has_finished_at"),
        ({"status": "failed", "finished_at": None}, "job_terminal_has_finished_at"),
        ({"status": "cancelled"}, "job_terminal_has_finished_at"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_check_constraints_refuse_bad_rows(columns, constraint):
    with pytest.raises(IntegrityError) as info:
        _raw_job(**columns)
    assert constraint in str(info.value) or "CHECK constraint failed" in str(info.value)
    assert Job.objects.filter(queue="constraints").count() == 0


@pytest.mark.django_db
def test_a_terminal_row_with_finished_at_is_accepted():
    _raw_job(status="succeeded", finished_at=timezone.now())
    assert Job.objects.filter(queue="constraints", status="succeeded").count() == 1


@pytest.mark.django_db
def test_event_seq_is_unique_per_job_and_positive():
    job = enqueue("ping", {}, queue="constraints")
    # seq 1 (job.enqueued) is implied, not stored: emit one so a stored seq exists.
    assert emit_event(job.pk, event="t.stored") == 2
    for seq in (2, 0, -1):
        with pytest.raises(IntegrityError), transaction.atomic():
            JobEvent.objects.create(job=job, seq=seq, event="x")
    assert list(JobEvent.objects.filter(job=job).values_list("seq", "event")) == [(2, "t.stored")]


@pytest.mark.django_db
@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_sqlite_runs_in_wal_mode_with_immediate_transactions():
    """WAL lets readers run beside the writer; IMMEDIATE takes the write lock at BEGIN."""
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0].lower() == "wal"
    assert connection.settings_dict["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout")
        assert cursor.fetchone()[0] > 0, "writers must wait for the lock, not fail at once"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor != 'sqlite'")
def test_sqlite_transactions_take_the_write_lock_at_begin():
    """A second connection cannot BEGIN IMMEDIATE while a transaction is open."""
    import sqlite3

    path = connection.settings_dict["NAME"]
    with transaction.atomic():
        Job.objects.exists()  # a read only: DEFERRED would not lock yet, IMMEDIATE has
        other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
        try:
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        finally:
            other.close()


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueue_with_one_idempotency_key_makes_one_job():
    """Two threads race on the same key: both get the same job back, one row exists."""
    key = f"race-{uuid.uuid4().hex}"
    start = threading.Barrier(2)
    got: list[uuid.UUID] = []
    errors: list[BaseException] = []

    def racer(n: int) -> None:
        try:
            start.wait(timeout=10)
            job = enqueue_many([JobSpec("sleep", {"seconds": n}, idempotency_key=key)])[0]
            got.append(job.pk)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=racer, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(got) == 2 and got[0] == got[1]
    assert Job.objects.filter(unique_key=key).count() == 1
    # No event row (job.enqueued is implied) and one job.enqueued on the one job's timeline.
    assert not JobEvent.objects.filter(job__unique_key=key).exists()
    assert timeline_of(got[0]) == [(1, "job.enqueued")]


def test_the_hand_written_sql_names_the_models_tables():
    from jobs.models import Job, JobEvent
    from jobs.tables import EVENT_TABLE, JOB_TABLE

    assert (JOB_TABLE, EVENT_TABLE) == (Job._meta.db_table, JobEvent._meta.db_table)


def _job_with_events(queue: str) -> Job:
    job = enqueue("ping", {}, queue=queue)
    assert drain_jobs(queues=[queue]).counts == {"succeeded": 1}
    emit_event(job.pk, event="t.after")
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=30))
    assert JobEvent.objects.filter(job_id=job.pk).count() >= 3
    return job


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["reaper retention", "jobs purge", "ORM delete"])
def test_every_path_that_deletes_jobs_deletes_their_events(path: str):
    """The events keep no foreign key to their jobs (migration 0019: its check at commit was
    a tenth of a drain's database CPU), so each deletion path must take the events along."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, JobEvent._meta.db_table)
    assert not [name for name, c in constraints.items() if c["foreign_key"]]
    queue = f"delete-{uuid.uuid4().hex[:8]}"
    job, kept = _job_with_events(queue), enqueue("ping", {}, queue=queue)
    emit_event(kept.pk, event="t.kept")
    if path == "reaper retention":
        assert delete_finished_jobs(timezone.now() - timedelta(days=7), 100, queues=[queue]) == 1
    elif path == "jobs purge":
        call_command("jobs", "purge", "--queue", queue, "--older-than", "7d", stdout=io.StringIO())
    else:
        Job.objects.get(pk=job.pk).delete()
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JobEvent.objects.filter(job_id=job.pk).exists()
    assert JobEvent.objects.filter(job_id=kept.pk).exists()
