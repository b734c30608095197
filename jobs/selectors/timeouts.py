"""A statement timeout around reads that people wait for (API lists, dashboard pages).

A filter nobody indexed (free text, payload containment) must not hold a
request, a worker thread of the web server and a database backend for
minutes on a big table: past the timeout PostgreSQL cancels the statement
and the caller answers 503.

The same reads give up on a table lock after ``READ_LOCK_TIMEOUT_MS``: a
page view must not queue behind a migration or a ``TRUNCATE`` (and every
statement queued behind it), nor deadlock one that already holds some of
the tables it reads. The timeout sits below PostgreSQL's default
``deadlock_timeout`` (1 s) so, in such a cycle, the read is the side that yields.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections, transaction

from jobs.conf import knob

READ_LOCK_TIMEOUT_MS = 500
_SET_LIMITS = (
    "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
    "set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)"
)
_RESTORE_LIMITS = (
    "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true)"
)


@contextmanager
def bounded_reads(using: str = "default") -> Iterator[None]:
    """Run the enclosed reads under ``DASHBOARD_STATEMENT_TIMEOUT_MS`` (API and dashboard).

    On PostgreSQL this opens a transaction so ``SET LOCAL`` ends with it. On
    SQLite nothing is opened: a transaction there would take the write lock
    (IMMEDIATE mode) and make workers wait for a page view.
    """
    if connections[using].vendor != "postgresql":
        yield
        return
    conn = connections[using]
    nested = conn.in_atomic_block
    with transaction.atomic(using=using):
        with conn.cursor() as cursor:
            # One round trip (the old values first: SET LOCAL would outlive our
            # savepoint when nested, so they are put back afterwards).
            cursor.execute(_SET_LIMITS, list(read_limits()))
            previous = cursor.fetchone()[:2]
        yield
        if nested:
            with conn.cursor() as cursor:
                cursor.execute(_RESTORE_LIMITS, list(previous))


def read_limits() -> tuple[str, str]:
    """``statement_timeout`` and ``lock_timeout`` of a bounded read, as PostgreSQL settings."""
    ms = int(knob("DASHBOARD_STATEMENT_TIMEOUT_MS"))
    lock_ms = min(ms, READ_LOCK_TIMEOUT_MS) if ms > 0 else READ_LOCK_TIMEOUT_MS  # 0: no timeout
    return f"{ms}ms", f"{lock_ms}ms"


def bounded_fetchall(using: str, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The rows of one read statement, run under the limits of ``bounded_reads``.

    Outside a transaction on PostgreSQL this is one round trip instead of four
    (BEGIN, the limits, the read, COMMIT): the limits and the read travel as
    one query string, which PostgreSQL runs as one implicit transaction, so
    ``set_config(..., true)`` holds for the read (each statement of such a
    string gets its own timeout, PostgreSQL 13 and later) and for nothing
    after it. A polled list spent more of its web thread's time on those
    round trips than on its page. Inside a transaction, with server-side
    binding, or on SQLite: ``bounded_reads`` around a plain execute.
    """
    conn = connections[using]
    if conn.vendor == "postgresql" and not conn.in_atomic_block and conn.get_autocommit():
        with conn.cursor() as cursor:
            if isinstance(cursor.cursor, psycopg.ClientCursor):  # binds on the client: one text
                cursor.execute(_LIMITS_THEN + sql, [*read_limits(), *params])
                cursor.nextset()
                return cursor.fetchall()
    with bounded_reads(using), conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


_LIMITS_THEN = (
    "SELECT set_config('statement_timeout', %s, true), set_config('lock_timeout', %s, true); "
)


def is_timeout(error: BaseException) -> bool:
    """True for a read cancelled by the statement timeout or refused by the lock timeout."""
    cause = error.__cause__ or error
    if getattr(cause, "sqlstate", None) in {"57014", "55P03"}:
        return True
    return "statement timeout" in str(error)
