"""A statement timeout around reads that people wait for (API lists, dashboard pages).

A filter nobody indexed (free text, payload containment) must not hold a
request, a worker thread of the web server and a database backend for
minutes on a big table: past the timeout PostgreSQL cancels the statement
and the caller answers 503.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections, transaction

from jobs.conf import knob


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
    ms = int(knob("DASHBOARD_STATEMENT_TIMEOUT_MS"))
    conn = connections[using]
    nested = conn.in_atomic_block
    with transaction.atomic(using=using):
        with conn.cursor() as cursor:
            if nested:  # SET LOCAL would outlive our savepoint: remember the old value
                cursor.execute("SHOW statement_timeout")
                previous = cursor.fetchone()[0]
            cursor.execute(f"SET LOCAL statement_timeout = {ms}")
        yield
        if nested:
            with conn.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])


def is_timeout(error: BaseException) -> bool:
    """True for PostgreSQL's "canceling statement due to statement timeout"."""
    cause = error.__cause__ or error
    return getattr(cause, "sqlstate", None) == "57014" or "statement timeout" in str(error)
