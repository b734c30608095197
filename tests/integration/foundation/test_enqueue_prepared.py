"""Enqueue's INSERT as a server-side prepared statement (jobs.prepared), and without one.

PostgreSQL only: SQLite has no prepared statements to speak of. Each test
reads ``pg_prepared_statements`` of the very session that enqueued.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.enqueue_statement import POSTGRES_INSERT, UNIFORM_INSERT
from jobs.models import Job, JobEvent
from jobs.pooling import is_transaction_pooled
from jobs.prepared import prepared_statements_on
from tests.integration.timelines import timeline_of

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"
    ),
]


def server_text(statement: str) -> str:
    """``statement`` as psycopg prepares it: each named parameter becomes $1, $2… in order."""
    numbers: dict[str, str] = {}
    parts = statement.split("%(")
    for index, part in enumerate(parts[1:], start=1):
        name, rest = part.split(")s", 1)
        parts[index] = numbers.setdefault(name, f"${len(numbers) + 1}") + rest
    return "".join(parts)


def prepared_enqueues(statement: str = UNIFORM_INSERT) -> list[tuple[int, int]]:
    """(generic, custom) plan counts of this session's prepared ``statement``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = %s",
            [server_text(statement)],
        )
        return cursor.fetchall()


@pytest.mark.skipif(
    connection.vendor == "postgresql" and is_transaction_pooled("default"),
    reason="behind a transaction pooler nothing is prepared (the test below)",
)
def test_enqueue_prepares_its_insert_once_per_session_and_reuses_it():
    assert prepared_statements_on("default")
    first = enqueue("sleep", {"seconds": 0})
    jobs = enqueue_many([JobSpec("sleep", {"seconds": i}) for i in range(3)])
    enqueue("sleep", {"seconds": 1}, queue="other")
    [(generic, custom)] = prepared_enqueues()
    assert generic + custom == 3  # one statement, executed three times
    assert Job.objects.filter(pk__in=[first.pk, *(j.pk for j in jobs)]).count() == 4
    assert Job.objects.count() == 5 and not JobEvent.objects.exists()  # job.enqueued implied
    assert timeline_of(jobs[2]) == [(1, "job.enqueued")]


def test_a_rolled_back_enqueue_leaves_nothing_and_the_next_one_still_works():
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("sleep", {"seconds": 0})
        raise RuntimeError("the caller changes its mind")
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0
    job = enqueue("sleep", {"seconds": 0})
    assert Job.objects.get().pk == job.pk
    assert not JobEvent.objects.exists()  # the job row alone: its job.enqueued is implied
    assert timeline_of(job) == [(1, "job.enqueued")]


@pytest.mark.parametrize(
    "how",
    ["knob", "prepare_threshold", "pooler"],
)
def test_prepared_statements_can_be_switched_off(how, settings, monkeypatch):
    """Behind PgBouncer in transaction mode nothing may be prepared (the next
    transaction may run on another server connection)."""
    if how == "knob":
        settings.CONTROLPLANE = {
            **getattr(settings, "CONTROLPLANE", {}),
            "PREPARED_STATEMENTS": False,
        }
    elif how == "prepare_threshold":
        options = {**connection.settings_dict.get("OPTIONS", {}), "prepare_threshold": None}
        monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    else:
        monkeypatch.setitem(connection.settings_dict, "POOLER", "transaction")
    assert not prepared_statements_on("default")
    job = enqueue("sleep", {"seconds": 0})
    enqueue_many([JobSpec("sleep", {"seconds": 0}) for _ in range(3)])
    assert prepared_enqueues() == [] and prepared_enqueues(POSTGRES_INSERT) == []
    assert Job.objects.count() == 4 and Job.objects.filter(pk=job.pk).exists()


def test_the_environment_switches_them_off_too(monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_PREPARED_STATEMENTS", "false")
    assert not prepared_statements_on("default")
    enqueue("sleep", {"seconds": 0})
    assert prepared_enqueues() == []


@pytest.mark.skipif(
    connection.vendor == "postgresql" and is_transaction_pooled("default"),
    reason="behind a transaction pooler nothing is prepared",
)
def test_hooks_and_the_query_log_still_see_the_prepared_insert():
    """Unwatched, the INSERT skips Django's cursor wrapper; watched, it goes through it."""
    seen: list[str] = []

    def hook(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(hook):
        enqueue("sleep", {"seconds": 0})
    with CaptureQueriesContext(connection) as logged:
        enqueue_many([JobSpec("sleep", {"seconds": 0}) for _ in range(2)])
    enqueue("sleep", {"seconds": 0})  # neither: the direct path
    assert seen == [UNIFORM_INSERT]
    assert [q["sql"] for q in logged.captured_queries if "INSERT" in q["sql"]] != []
    [(generic, custom)] = prepared_enqueues()
    assert generic + custom == 3  # all three paths used the one prepared statement
    assert Job.objects.count() == 4 and not JobEvent.objects.exists()


def test_a_connection_shared_between_threads_does_not_use_the_kept_cursor(monkeypatch):
    import jobs.prepared as prepared

    def kept(connection):
        raise AssertionError("the kept cursor is for one thread's connection only")

    connection.inc_thread_sharing()
    try:
        monkeypatch.setattr(prepared, "_preparing_cursor", kept)
        job = enqueue("sleep", {"seconds": 0})
    finally:
        connection.dec_thread_sharing()
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_kept_cursor_follows_a_reconnect():
    enqueue("sleep", {"seconds": 0})
    connection.close()
    job = enqueue("sleep", {"seconds": 0})
    assert Job.objects.filter(pk=job.pk).exists()


def test_an_enqueue_after_a_failed_statement_in_the_transaction_is_refused():
    """As with Django's cursor: a broken atomic block refuses further queries."""
    from django.db import DatabaseError
    from django.db.transaction import TransactionManagementError

    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False):
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
        with pytest.raises(TransactionManagementError):
            enqueue("sleep", {"seconds": 0})
        transaction.set_rollback(True)


def test_enqueue_from_an_event_loop_thread_is_refused():
    import asyncio

    from django.core.exceptions import SynchronousOnlyOperation

    async def call() -> None:
        enqueue("sleep", {"seconds": 0})

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(call())


def test_a_batch_with_differing_columns_takes_the_general_statement():
    """Jobs sharing operation, queue, priority, run_after, expires_at and max_attempts
    take the uniform INSERT (those as parameters); any other batch the general one."""
    from datetime import timedelta

    from django.utils import timezone

    later = timezone.now() + timedelta(hours=1)
    uniform = enqueue_many(
        [JobSpec("sleep", {"seconds": i}, queue="u", priority=3, max_attempts=4) for i in range(2)]
    )
    mixed = enqueue_many(
        [
            JobSpec("sleep", {"seconds": 0}, queue="a", priority=5),
            JobSpec("sleep", {"seconds": 1}, queue="b", max_attempts=7, run_after=later),
            JobSpec("fail", {"message": "x"}, queue="a", expires_at=later, unique_key="k"),
        ]
    )
    stored = {
        job.pk: job
        for job in Job.objects.filter(pk__in=[j.pk for j in uniform + mixed]).order_by("pk")
    }
    for made in uniform + mixed:
        kept = stored[made.pk]
        for name in (
            "operation",
            "queue",
            "priority",
            "payload",
            "run_after",
            "expires_at",
            "max_attempts",
            "unique_key",
            "unique_while",
            "created_at",
        ):
            assert getattr(kept, name) == getattr(made, name), name
    assert [stored[j.pk].queue for j in mixed] == ["a", "b", "a"]
    assert stored[mixed[1].pk].run_after == later and stored[mixed[2].pk].unique_key == "k"
    if prepared_statements_on("default"):
        assert [sum(p) for p in prepared_enqueues()] == [1]
        assert [sum(p) for p in prepared_enqueues(POSTGRES_INSERT)] == [1]
