"""An operation's own database errors count against its attempts; only an outage does not.

An ``OperationalError`` raised inside an operation (a statement timeout, on
SQLite "no such table") is the operation's failure, not an outage: taken for
one, the job would be requeued without counting the attempt, for ever. Only
evidence that the database went away (SQLSTATE class 08 or 57P01-57P03, a
connection psycopg marks broken, the worker's health check failing) is an
outage, and outage requeues are capped by
``MAX_OUTAGE_REQUEUES``, each one a ``job.outage_requeue`` in the timeline.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from django.db import OperationalError, connection, transaction

from jobs.claims import ClaimedJob, claim_jobs
from jobs.conf import knob
from jobs.enqueue import enqueue
from jobs.events import JOB_OUTAGE_REQUEUE
from jobs.models import Job, JobEvent
from jobs.transitions import (
    OUTAGE_ERROR_CODE,
    outage_requeues_spent,
    requeue_after_outage,
    retry_job,
)
from tests.conftest import FAST_KNOBS, wait_for
from tests.integration.engine import db_error_ops
from tests.integration.engine.conftest import TEST_MODULES
from tests.integration.timelines import events_of, timeline_of
from workers.config import WorkerConfig
from workers.resilience import database_answers, is_outage

pytestmark = pytest.mark.django_db(transaction=True)

OPS_ENV = {
    "CONTROLPLANE_OPERATION_MODULES": f"{TEST_MODULES},{db_error_ops.MODULE}",
    "CONTROLPLANE_MAX_OUTAGE_REQUEUES": "2",
}


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def _events(job: Job) -> list[str]:
    return events_of(job)


def _terminal(*jobs: Job) -> bool:
    return all(
        status in {"succeeded", "failed", "cancelled"}
        for status in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list(
            "status", flat=True
        )
    )


def _outage(run) -> bool:
    """Run ``run``; classify its error as the runner does, while the connection is as it left it."""
    try:
        run()
    except Exception as error:  # noqa: BLE001 - the error is what is under test
        return is_outage(error)
    finally:
        connection.close()  # whatever the error did to it
    raise AssertionError("the statement did not fail")


def _sql(*statements: str, atomic: bool = False):
    def run() -> None:
        if atomic:
            with transaction.atomic(), connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)
        else:
            with connection.cursor() as cursor:
                for statement in statements:
                    cursor.execute(statement)

    return run


# --- real workers ----------------------------------------------------------------


def test_an_operations_own_database_errors_count_against_its_attempts(worker):
    kinds = ["missing_table", "syntax_error"]
    if connection.vendor == "postgresql":
        kinds.append("statement_timeout")
    queue = f"own-errors-{uuid.uuid4().hex[:6]}"
    jobs = {kind: enqueue("test.db_error", {"kind": kind}, queue=queue) for kind in kinds}
    proc = worker(queue, args=("--concurrency", "3"), env=OPS_ENV)
    # Before the fix these were requeued without end and never became terminal.
    wait_for(lambda: _terminal(*jobs.values()), timeout=30, message="every job to end")
    for kind, job in jobs.items():
        stored = Job.objects.get(pk=job.pk)
        # The operation marks DatabaseError retryable, with 2 attempts: it ran
        # twice, each run counted, then failed like any other exception.
        assert (stored.status, stored.attempts) == ("failed", 2), (kind, proc.output())
        assert stored.error_code in {"OperationalError", "ProgrammingError"}, kind
        assert _events(job) == [
            "job.enqueued",
            "job.started",
            "job.retry_scheduled",
            "job.started",
            "job.failed",
        ], kind
    timeout = Job.objects.get(pk=jobs.get("statement_timeout", jobs["syntax_error"]).pk)
    assert timeout.error_message  # the database's own words, e.g. "canceling statement …"
    assert proc.popen.poll() is None, proc.output()


def test_a_killed_session_requeues_the_job_without_counting_then_it_succeeds(worker):
    _postgres_only()
    job = enqueue("test.session_killed", {"times": 1}, queue="killed-once")
    proc = worker("killed-once", env=OPS_ENV)
    wait_for(lambda: _terminal(job), timeout=30, message="the job to end")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.attempts) == ("succeeded", 1), proc.output()
    assert stored.result == {"runs_cut": 1}
    assert _events(job) == [
        "job.enqueued",
        "job.started",
        JOB_OUTAGE_REQUEUE,
        "job.started",
        "job.succeeded",
    ]
    requeue = JobEvent.objects.get(job_id=job.pk, event=JOB_OUTAGE_REQUEUE)
    assert requeue.level == "warning"
    assert "terminating connection due to administrator command" in requeue.fields["cause"]
    assert requeue.fields["outage_requeues"] == 1 and requeue.fields["max_outage_requeues"] == 2
    assert "without counting the attempt" in requeue.message
    assert f"job.outage_requeue job_id={job.pk}" in proc.output()


def test_outage_requeues_are_capped_with_backoff_then_the_job_fails_naming_the_cause(worker):
    _postgres_only()
    job = enqueue("test.session_killed", {}, queue="killed-always")
    proc = worker("killed-always", env=OPS_ENV)
    wait_for(lambda: _terminal(job), timeout=30, message="the job to end")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.error_code, stored.attempts) == (
        "failed",
        OUTAGE_ERROR_CODE,
        1,
    ), proc.output()
    assert "during 3 runs" in stored.error_message
    assert "terminating connection due to administrator command" in stored.error_message
    assert _events(job) == [
        "job.enqueued",
        "job.started",
        JOB_OUTAGE_REQUEUE,
        "job.started",
        JOB_OUTAGE_REQUEUE,
        "job.started",
        "job.failed",
    ]
    requeues = JobEvent.objects.filter(job_id=job.pk, event=JOB_OUTAGE_REQUEUE).order_by("seq")
    base = float(FAST_KNOBS["CONTROLPLANE_RETRY_BACKOFF_SECONDS"])  # what the worker ran with
    for number, event in enumerate(requeues, start=1):
        assert event.fields["outage_requeues"] == number
        step = base * 2 ** (number - 1)  # exponential, jittered within [0.5, 1] of the step
        assert step * 0.5 - 0.001 <= event.fields["delay_seconds"] <= step + 0.001, event.fields
    assert proc.popen.poll() is None, proc.output()


# --- the transition, in-process ---------------------------------------------------------


def _claim(job: Job) -> ClaimedJob:
    claimed = claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert [c.id for c in claimed] == [job.pk]
    return claimed[0]


def test_the_outage_budget_is_counted_from_the_timeline_and_reset_by_an_operator_retry():
    job = enqueue("ping", queue=f"budget-{uuid.uuid4().hex[:6]}")
    delays: list[int] = []

    def backoff(number: int) -> float:
        delays.append(number)
        return 0.0

    for _ in range(2):
        held = _claim(job)
        status = requeue_after_outage(
            job.pk, lease_token=held.lease_token, cause="X: gone", max_requeues=2, backoff=backoff
        )
        assert status == "queued"
    assert delays == [1, 2] and outage_requeues_spent(job.pk) == 2
    held = _claim(job)
    assert (
        requeue_after_outage(
            job.pk, lease_token=held.lease_token, cause="X: gone", max_requeues=2, backoff=backoff
        )
        == "failed"
    )
    failed = Job.objects.get(pk=job.pk)
    assert failed.error_code == OUTAGE_ERROR_CODE and "X: gone" in failed.error_message
    assert failed.attempts == 1  # the two requeued runs were not counted
    seqs = [seq for seq, _ in timeline_of(job)]
    assert seqs == list(range(1, len(seqs) + 1))  # no gaps

    retry_job(job.pk, by="operator")
    assert outage_requeues_spent(job.pk) == 0
    held = _claim(job)
    status = requeue_after_outage(
        job.pk, lease_token=held.lease_token, cause="X: gone", max_requeues=2, backoff=backoff
    )
    assert status == "queued" and delays[-1] == 1


def test_a_budget_of_zero_fails_at_the_first_outage():
    job = enqueue("ping", queue=f"budget0-{uuid.uuid4().hex[:6]}")
    held = _claim(job)
    status = requeue_after_outage(
        job.pk, lease_token=held.lease_token, cause="X: gone", max_requeues=0, backoff=lambda n: 1
    )
    assert status == "failed"
    assert JOB_OUTAGE_REQUEUE not in _events(job)


def test_the_cap_is_a_knob(monkeypatch, settings):
    assert knob("MAX_OUTAGE_REQUEUES") == 3
    settings.CONTROLPLANE = {"MAX_OUTAGE_REQUEUES": 5}
    assert WorkerConfig(queues=("q",)).max_outage_requeues == 5
    monkeypatch.setenv("CONTROLPLANE_MAX_OUTAGE_REQUEUES", "1")
    assert WorkerConfig(queues=("q",)).max_outage_requeues == 1


# --- telling an outage from the operation's own error, on real errors ---------------------


def test_the_health_check_answers_on_a_live_database():
    assert database_answers() is True


def test_sqlite_errors_of_the_operation_are_not_an_outage():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    assert not _outage(_sql("SELECT * FROM no_such_table"))
    assert not _outage(_sql("SELEC 1"))


def test_postgresql_errors_of_the_operation_are_not_an_outage():
    _postgres_only()
    assert not _outage(
        _sql("SET LOCAL statement_timeout = '20ms'", "SELECT pg_sleep(2)", atomic=True)
    )
    assert not _outage(_sql("SELECT * FROM no_such_table"))
    assert not _outage(_sql("SELEC 1"))


def test_postgresql_a_terminated_or_closed_session_is_an_outage():
    _postgres_only()
    assert _outage(_sql("SELECT pg_terminate_backend(pg_backend_pid())"))

    def wrapped_by_the_operation() -> None:
        try:
            _sql("SELECT pg_terminate_backend(pg_backend_pid())")()
        except Exception as error:
            raise RuntimeError("could not load the report") from error

    assert _outage(wrapped_by_the_operation)

    def closed_under_us() -> None:
        connection.ensure_connection()
        connection.connection.close()  # as after a network drop psycopg noticed
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    assert _outage(closed_under_us)

    def socket_cut_in_a_transaction() -> None:
        # What pg_terminate_backend mid-statement sometimes looks like to psycopg:
        # "consuming input failed: server closed the connection unexpectedly",
        # no SQLSTATE, and a connection psycopg still calls idle (seen in test_chaos).
        connection.ensure_connection()
        cut = socket.socket(fileno=os.dup(connection.connection.fileno()))
        cut.shutdown(socket.SHUT_RDWR)
        cut.close()
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    assert _outage(socket_cut_in_a_transaction)


def test_a_failing_health_check_makes_an_unexplained_error_an_outage():
    # No SQLSTATE (SQLite never gives one; nor does a failed connect) and no
    # broken connection: the worker asks the database whether it still answers.
    error = OperationalError("server closed the connection unexpectedly")
    assert is_outage(error, health_check=lambda: False)
    assert not is_outage(error, health_check=lambda: True)
    assert not is_outage(RuntimeError("not a database error"), health_check=lambda: False)
