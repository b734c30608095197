"""Dashboard reads stay bounded: statement timeout, capped counts, estimates, index-friendly SQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard import selectors
from jobs.models import Job
from jobs.selectors import counts, timeouts
from jobs.selectors import job_count as core_job_count
from tests.factories import queued


@pytest.fixture
def postgres(db) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL feature")


postgres_only = pytest.mark.usefixtures("postgres")


@postgres_only
def test_statement_timeout_turns_a_slow_page_into_a_503(
    operator_client: Client, monkeypatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "50")
    monkeypatch.setattr(selectors, "queue_names", _slow_queue_names)
    response = operator_client.get("/dashboard/jobs/")
    assert response.status_code == 503
    assert b"took too long" in response.content
    assert operator_client.get("/dashboard/workers/").status_code == 200  # the connection recovered


@contextmanager
def transaction_cursor() -> Iterator[Any]:
    from django.db import transaction

    with transaction.atomic(), connection.cursor() as cursor:
        yield cursor


def _slow_queue_names(limit: int = 1000) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(1)")
    return []


@postgres_only
def test_bounded_reads_set_the_timeout_in_a_transaction(monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "1234")
    with timeouts.bounded_reads():
        with connection.cursor() as cursor:
            cursor.execute("SHOW statement_timeout")
            assert cursor.fetchone()[0] == "1234ms"
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] != "1234ms"


@postgres_only
def test_a_read_behind_a_table_lock_gives_up_on_the_lock_not_the_statement(monkeypatch) -> None:
    """A page never queues behind DDL or a TRUNCATE, nor deadlocks one: the lock timeout ends it."""
    from django.db import DatabaseError, connections, transaction

    from jobs.independent import independent_connection

    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "60000")
    with independent_connection() as other:
        try:
            with transaction.atomic(using=other), connections[other].cursor() as cursor:
                cursor.execute("LOCK TABLE controlplane_job IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(DatabaseError) as error, timeouts.bounded_reads():
                    Job.objects.count()
        finally:
            connections[other].close()
    assert getattr(error.value.__cause__, "sqlstate", None) == "55P03"  # lock_not_available
    assert timeouts.is_timeout(error.value)  # so the views answer 503
    with timeouts.bounded_reads():
        assert Job.objects.count() == 0  # the connection recovered


@postgres_only
def test_nested_bounded_reads_restore_both_limits(monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "1234")
    settings = "SELECT current_setting('statement_timeout'), current_setting('lock_timeout')"
    with transaction_cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '7s'")
        cursor.execute("SET LOCAL statement_timeout = '9s'")
        with timeouts.bounded_reads():
            cursor.execute(settings)
            assert cursor.fetchone() == ("1234ms", "500ms")
        cursor.execute(settings)
        assert cursor.fetchone() == ("9s", "7s")


@postgres_only
def test_unfiltered_list_uses_the_planner_estimate(monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "2")
    for _ in range(4):
        queued()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE controlplane_job")
    total = core_job_count(None, estimate_table=True)
    assert total.estimated and str(total).startswith("≈")


def test_no_page_counts_the_whole_table(operator_client: Client) -> None:
    for _ in range(3):
        queued()
    for path in ("/dashboard/", "/dashboard/jobs/", "/dashboard/queues/", "/dashboard/workers/"):
        with CaptureQueriesContext(connection) as ctx:
            assert operator_client.get(path).status_code == 200
        for query in ctx.captured_queries:
            sql = query["sql"].upper()
            if "COUNT(" in sql and "JOBS_JOB" in sql and "FROM JOBS_JOB" in sql:
                assert "LIMIT" in sql or "WHERE" in sql, sql
            assert "SELECT DISTINCT" not in sql or "JOBS_JOB" not in sql, sql


def test_capped_count(db) -> None:
    for _ in range(3):
        queued(queue="cc")
    qs = Job.objects.filter(queue="cc")
    assert str(counts.capped_count(qs, limit=2)) == "2+"
    assert str(counts.capped_count(qs, limit=3)) == "3"


def test_queue_names_skip_scan_finds_every_queue(db) -> None:
    for name in ("a", "b", "c.batch"):
        queued(queue=name)
    assert {"a", "b", "c.batch"} <= set(selectors.queue_names())


def _show_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


@postgres_only
def test_websocket_catch_up_reads_run_under_the_timeout(monkeypatch) -> None:
    """The socket's catch-up reads (job timeline, gap fill, list rows) are bounded too."""
    from dashboard import consumers, detail
    from dashboard.relay import Subscription
    from jobs.selectors import JobFilters

    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "4321")
    seen: list[str] = []
    real_events_after = detail.events_after

    def spying_events_after(*args, **kwargs):
        seen.append(_show_timeout())
        return real_events_after(*args, **kwargs)

    monkeypatch.setattr(detail, "events_after", spying_events_after)
    job = queued()
    consumers._job_since(job.pk, "operator", 0)
    consumers._entries_between(job.pk, 0, 5)
    assert seen == ["4321ms", "4321ms"]

    real_job_rows = selectors.job_rows

    def spying_job_rows(ids):
        seen.append(_show_timeout())
        return real_job_rows(ids)

    monkeypatch.setattr(selectors, "job_rows", spying_job_rows)
    sub = Subscription(page="jobs", role="operator", ids={str(job.pk)}, filters=JobFilters())
    consumers._list_since(sub, "operator", job.created_at.replace(year=2000), None)
    assert seen[-1] == "4321ms"


@postgres_only
def test_a_slow_bulk_preview_is_a_503_not_a_held_database(
    operator_client: Client, monkeypatch
) -> None:
    from jobs import bulk_actions as actions

    queued()
    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "50")

    def slow_count(qs, limit=None):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(1)")
        return counts.CountResult(0)

    monkeypatch.setattr(actions, "capped_count", slow_count)
    response = operator_client.post("/dashboard/jobs/bulk/", {"do": "cancel-filter"})
    assert response.status_code == 503
    assert b"took too long" in response.content
    assert operator_client.get("/dashboard/workers/").status_code == 200


@postgres_only
def test_bulk_run_reads_its_batches_under_the_timeout(monkeypatch) -> None:
    """A batch read slowed past the timeout is cancelled by PostgreSQL, not waited for."""
    from django.db import DatabaseError

    from jobs import bulk_actions as actions
    from jobs.selectors import JobFilters

    job = queued()
    plan = actions.plan_bulk("cancel", scope="selected", ids=[job.pk], filters=JobFilters())
    monkeypatch.setenv("CONTROLPLANE_DASHBOARD_STATEMENT_TIMEOUT_MS", "50")

    def slow_batch_read(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith("SELECT") and "ORDER BY" in sql.upper():
            execute("SELECT pg_sleep(1)", None, many, context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(slow_batch_read), pytest.raises(DatabaseError) as error:
        actions.run_bulk(plan, user=None)
    assert timeouts.is_timeout(error.value)
    assert Job.objects.get(pk=job.pk).status == "queued"
