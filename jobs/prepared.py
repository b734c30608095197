"""Server-side prepared statements for the hot statements (today: enqueue's INSERT).

Django's psycopg connections bind parameters on the client and prepare
nothing (``prepare_threshold = None``, so that connection poolers work): each
statement travels as one text with its values quoted in, and the server
parses and plans it anew. For the enqueue statement (a CTE over a JSON
document: the jobs, their events and the NOTIFY) that parse and plan cost the
server more CPU than the rows themselves when one job is enqueued per call,
and quoting a 1,000-job document costs the client more than building it.
``fetch_all`` sends such a statement with server-side binding and prepares
it once per connection: the document travels apart from the text and the
plan is reused. The enqueue plan does not depend on table sizes (an INSERT
from a document; unique indexes arbitrate conflicts), so a plan made on an
empty table stays right (PERF-NOTES, "Cached plans made on an empty table").
The check of its events' foreign key is another matter, and PostgreSQL's
own: planned once per session, it is a sequential scan if the job table's
statistics said "empty" then (analyzed while empty, and no autoanalyze
since); autovacuum's next ANALYZE replaces it (bench/enqueue.py --unanalyzed).

Off, the statement is sent like every other query, when:

- ``CONTROLPLANE["PREPARED_STATEMENTS"]`` (``CONTROLPLANE_PREPARED_STATEMENTS``)
  is false;
- the database's ``OPTIONS`` set ``prepare_threshold`` to None themselves
  (psycopg's way to say "no prepared statements");
- the database goes through a transaction pooler (``POOLER = "transaction"``,
  ``jobs.pooling``): PgBouncer before 1.21 hands each transaction another
  server connection, where the prepared statement does not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from django.db import connections

from jobs.conf import knob
from jobs.pooling import TRANSACTION_POOLER

# Positional (%s) or named (%(name)s) parameters, as psycopg takes them.
Params = Sequence[Any] | Mapping[str, Any]

# psycopg prepares only on connections whose threshold is set, and Django
# leaves it None. A threshold no statement reaches makes psycopg prepare
# exactly what is sent here (``prepare=True``) and nothing else by itself.
_NEVER_BY_COUNT = 1 << 62


class _PreparingCursor(psycopg.Cursor):
    """Server-side binding, every statement prepared (psycopg keeps one per text)."""

    def execute(self, query: Any, params: Any = None, *, prepare: Any = None, **kwargs: Any) -> Any:
        return super().execute(query, params, prepare=True, **kwargs)


def prepared_statements_on(using: str = "default") -> bool:
    """Whether hot statements are prepared on ``using`` (see the module docstring)."""
    return _prepared_on(connections[using])


def _prepared_on(connection: Any) -> bool:
    """``prepared_statements_on`` for a connection already looked up (once per enqueue)."""
    if connection.vendor != "postgresql":
        return False
    settings_dict = connection.settings_dict
    if settings_dict.get("POOLER") == TRANSACTION_POOLER:
        return False
    options = settings_dict.get("OPTIONS")
    if options and "prepare_threshold" in options and options["prepare_threshold"] is None:
        return False
    return bool(knob("PREPARED_STATEMENTS"))


def fetch_all(
    using: str, statement: str, params: Params, *, unless_rowcount: int | None = None
) -> list[tuple[Any, ...]] | None:
    """Run ``statement`` on ``using`` (prepared when allowed); return its rows.

    ``unless_rowcount``: None instead, without loading them, when the
    statement returned exactly that many rows. Bulk enqueue learns this way
    that every job was stored without building 1,000 UUIDs and tuples that
    the cyclic collector would then scan.

    Whatever the path, Django's guarantees hold: the connection is opened and
    health-checked, a broken transaction refuses the query, errors come
    wrapped as Django's, and nothing runs from an event loop's thread. With
    ``execute_wrapper`` hooks installed or queries logged (``DEBUG``,
    ``assertNumQueries``) the statement goes through Django's cursor so that
    they see it (so it does on a connection shared between threads);
    otherwise it skips the cursor wrapper and reuses one preparing cursor per
    connection, about 50 us less client CPU per call (a fifth of a one-job
    enqueue's, measured).
    """
    connection = connections[using]
    if not _prepared_on(connection):
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return _rows(cursor, unless_rowcount)
    if connection.execute_wrappers or connection.queries_logged or connection.allow_thread_sharing:
        return _through_django_cursor(connection, statement, params, unless_rowcount)
    return _direct(connection, statement, params, unless_rowcount)


def _rows(cursor: Any, unless_rowcount: int | None) -> list[tuple[Any, ...]] | None:
    if unless_rowcount is not None and cursor.rowcount == unless_rowcount:
        return None
    return cursor.fetchall()


def _through_django_cursor(
    connection: Any, statement: str, params: Params, unless_rowcount: int | None
) -> list[tuple[Any, ...]] | None:
    """The statement through Django's own cursor, its psycopg cursor swapped for a preparing one.

    A fresh one: a connection shared between threads must not share the kept cursor.
    """
    with connection.cursor() as cursor:
        client = cursor.cursor
        raw = client.connection
        if raw.prepare_threshold is None:
            raw.prepare_threshold = _NEVER_BY_COUNT
        cursor.cursor = _PreparingCursor(raw)
        try:
            cursor.execute(statement, params)
            return _rows(cursor, unless_rowcount)
        finally:
            cursor.cursor.close()
            cursor.cursor = client


def _direct(
    connection: Any, statement: str, params: Params, unless_rowcount: int | None
) -> list[tuple[Any, ...]] | None:
    """What ``connection.cursor().execute()`` checks and wraps, around the reused cursor.

    ``ensure_connection`` is ``async_unsafe``: an event loop's thread is refused here too.
    """
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        cursor = _preparing_cursor(connection)
        cursor.execute(statement, params)
        return _rows(cursor, unless_rowcount)


def _preparing_cursor(connection: Any) -> _PreparingCursor:
    """The connection's preparing cursor, made once per psycopg connection.

    Kept on Django's connection wrapper (one per thread and alias) with the
    psycopg connection it belongs to: a reconnect gets a new one.
    """
    raw = connection.connection
    kept = connection.__dict__.get(_KEPT)
    if kept is not None and kept[0] is raw:
        return kept[1]
    if raw.prepare_threshold is None:
        raw.prepare_threshold = _NEVER_BY_COUNT
    cursor = _PreparingCursor(raw)
    connection.__dict__[_KEPT] = (raw, cursor)
    return cursor


_KEPT = "_controlplane_preparing_cursor"
