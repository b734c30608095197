"""Operations that meet real database errors, loaded by worker subprocesses of these tests.

Nothing here fakes an error: each one runs SQL that the database refuses,
or ends its own session on the server the way ``pg_terminate_backend`` (an
operator, a failover, a restart) does.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connection, transaction

from jobs.operations import JobContext, operation

MODULE = "tests.integration.engine.db_error_ops"


@operation("test.db_error", max_attempts=2, retryable_exceptions=(DatabaseError,))
def db_error(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Runs SQL that fails on its own: a missing table, a syntax error, a statement timeout."""
    kind = payload["kind"]
    if kind == "statement_timeout":  # PostgreSQL: 57014, an OperationalError
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '50ms'")
            cursor.execute("SELECT pg_sleep(5)")
        return
    sql = {"missing_table": "SELECT * FROM no_such_table", "syntax_error": "SELEC 1"}[kind]
    with connection.cursor() as cursor:
        cursor.execute(sql)


@operation("test.session_killed")
def session_killed(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    """PostgreSQL: its session is terminated on the server during its first ``times`` runs."""
    from jobs.models import JobEvent

    runs_cut = JobEvent.objects.filter(job_id=ctx.job_id, event="job.outage_requeue").count()
    if runs_cut < int(payload.get("times", 1_000_000)):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    return {"runs_cut": runs_cut}
