"""Which errors behind a transaction pooler mean the database went away (no database).

The errors are built as psycopg builds them (its classes carry their SQLSTATE)
and wrapped as Django wraps them. The health check is forced to say the
database answers, since through a pooler it does (the pooler does): what
decides must be the error itself. ``tests/integration/pgbouncer`` raises the
same errors through a real PgBouncer.
"""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from django.db import InternalError as DjangoInternalError
from django.db import OperationalError as DjangoOperationalError
from psycopg import errors

from workers.pooler_outages import session_lost_behind_pooler
from workers.resilience import is_outage, is_transient

MISMATCH = "received 2 results from command 'COMMIT'"


def answers() -> bool:
    return True


class _HungUpConnection(psycopg.Connection):
    """A psycopg connection without a server, closed or not, whose COMMIT got two results."""

    def __init__(self, *, closed: bool) -> None:  # no pgconn: nothing to connect
        self.hung_up = closed

    @property
    def closed(self) -> bool:  # type: ignore[override]
        return self.hung_up

    def commit(self) -> None:
        raise psycopg.InternalError(MISMATCH)


class _HungUpCursor(psycopg.Cursor):
    """A cursor of such a connection whose ``execute`` got two results for its ``BEGIN``."""

    def __init__(self, connection: _HungUpConnection) -> None:  # nothing to prepare
        self._conn = connection

    def execute(self, *args: object, **kwargs: object) -> _HungUpCursor:  # type: ignore[override]
        # Raised right here: psycopg's cursor re-raises its errors with the
        # traceback cut short, so the connection's own frames are not in it.
        raise psycopg.InternalError("received 2 results from command 'BEGIN'")


def _as_django_raises(driver_call) -> Exception:
    """The error Django raises when ``driver_call`` fails (its wrapper chains the driver's)."""
    try:
        try:
            driver_call()
        except psycopg.InternalError as error:
            raise DjangoInternalError(*error.args) from error
        except psycopg.OperationalError as error:
            raise DjangoOperationalError(*error.args) from error
    except Exception as raised:  # noqa: BLE001 - the error is what is under test
        return raised
    raise AssertionError("the call did not fail")


def _raise(error: Exception):
    def call() -> None:
        raise error

    return call


# --- the one signature only a pooler produces ---------------------------------------------


def test_two_results_for_commit_on_a_connection_the_pooler_closed_is_an_outage() -> None:
    error = _as_django_raises(_HungUpConnection(closed=True).commit)
    assert session_lost_behind_pooler(error.__cause__)
    assert is_outage(error, health_check=answers)
    assert is_transient(error)  # the worker's own COMMIT is retried, not raised


def test_two_results_for_begin_on_a_cursor_of_a_closed_connection_is_an_outage() -> None:
    cursor = _HungUpCursor(_HungUpConnection(closed=True))
    error = _as_django_raises(lambda: cursor.execute("SELECT 1"))
    assert is_outage(error, health_check=answers)
    assert is_transient(error)
    still_open = _HungUpCursor(_HungUpConnection(closed=False))
    assert not is_outage(_as_django_raises(still_open.execute), health_check=answers)


def test_the_same_message_on_a_connection_still_open_is_not_an_outage() -> None:
    error = _as_django_raises(_HungUpConnection(closed=False).commit)
    assert not session_lost_behind_pooler(error.__cause__)
    assert not is_outage(error, health_check=answers)
    assert not is_transient(error)


def test_without_the_connection_that_raised_it_there_is_no_evidence() -> None:
    error = _as_django_raises(_raise(psycopg.InternalError(MISMATCH)))
    assert not is_outage(error, health_check=answers)
    assert not is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        errors.InternalError_("cache lookup failed for relation 16384"),  # XX000, the server's
        psycopg.InternalError("something else went wrong on 'COMMIT'"),
    ],
)
def test_other_internal_errors_stay_the_operations_own(error: Exception) -> None:
    assert not session_lost_behind_pooler(error)
    assert not is_outage(_as_django_raises(_raise(error)), health_check=answers)


# --- PgBouncer's own errors, as they arrive ----------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        # PgBouncer 1.18 sends its failures as 08P01.
        errors.ProtocolViolation("server conn crashed?"),
        errors.ProtocolViolation("query_wait_timeout"),
        errors.ProtocolViolation("pgbouncer cannot connect to server"),
        errors.ProtocolViolation(
            "server login has been failing, try again later (server_login_retry)"
        ),
        # Later versions use PostgreSQL's own codes where one fits.
        errors.TooManyConnections("no more connections allowed (max_client_conn)"),
        errors.CannotConnectNow("the database system is starting up"),
        # A refused connect and a closed socket come without a SQLSTATE.
        psycopg.OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 6432 failed: '
            "FATAL:  no more connections allowed (max_client_conn)"
        ),
        psycopg.OperationalError("server closed the connection unexpectedly"),
    ],
    ids=lambda error: str(error)[:40],
)
def test_pgbouncers_own_failures_are_outages(error: Exception) -> None:
    raised = _as_django_raises(_raise(error))
    assert is_outage(raised, health_check=answers)
    assert is_transient(raised)


# --- nothing changes where there is no pooler ---------------------------------------------


def test_sqlite_errors_are_judged_as_before() -> None:
    missing = sqlite3.OperationalError("no such table: report")
    assert not session_lost_behind_pooler(missing)
    assert not is_outage(missing, health_check=answers)
    assert is_outage(missing, health_check=lambda: False)


def test_a_statement_timeout_is_still_the_operations_own() -> None:
    timeout = errors.QueryCanceled("canceling statement due to statement timeout")
    assert not is_outage(_as_django_raises(_raise(timeout)), health_check=answers)
