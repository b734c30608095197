"""Surviving database trouble: which errors are transient, and how long to back off.

A worker never dies because the database restarted or the network dropped:
it backs off exponentially with jitter (capped) and resumes when the
database answers again.

Two questions, two answers. For the worker's own statements (claims, lease
extensions, outcome writes: known-good SQL), any ``OperationalError`` is the
database's trouble and worth retrying: ``is_transient``. An operation's SQL is
arbitrary, so an ``OperationalError`` it raises is its own failure (a
statement timeout, a missing table, a syntax error on SQLite) unless there is
evidence that the database itself went away: ``is_outage``.
"""

from __future__ import annotations

import copy
import logging
import random
import sys
from collections.abc import Callable, Iterator

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db import Error as DjangoDatabaseError

from jobs.conf import knob
from workers.pooler_outages import session_lost_behind_pooler

log = logging.getLogger("workers")

TRANSIENT_SQLSTATES = {
    "40001",
    "40P01",
    "57P01",
    "57P02",
    "57P03",
    "08000",
    "08003",
    "08006",
    "08001",
}


def is_transient(error: BaseException) -> bool:
    """For the worker's own statements: deadlocks, serialization failures, dropped
    connections (directly or behind a pooler), a busy SQLite file. Never used for an
    operation's errors (``is_outage``)."""
    if isinstance(error, (OperationalError, InterfaceError)):
        return True
    if any(session_lost_behind_pooler(link) for link in _chain(error)):
        return True
    cause = getattr(error, "__cause__", None)
    sqlstate = getattr(cause, "sqlstate", None)
    return isinstance(error, DatabaseError) and sqlstate in TRANSIENT_SQLSTATES


# SQLSTATEs that mean the session or the server is gone, not that a statement
# failed: class 08 (connection exception), the server shutting down or
# restarting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
# cannot_connect_now) and 53300 (too_many_connections: no session to be had).
OUTAGE_SQLSTATE_CLASSES = ("08",)
OUTAGE_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300"})

# How long the health check may take to connect and answer.
HEALTH_CHECK_SECONDS = 5


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the errors it was raised from (Django wraps the driver's error)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _database_error_types() -> tuple[type[BaseException], ...]:
    """Django's database errors and each loaded driver's own: a driver not imported
    raised nothing (and importing sqlite3 for its ``Error`` cost a PostgreSQL worker's
    start-up a millisecond)."""
    kinds: list[type[BaseException]] = [DjangoDatabaseError]
    for driver in ("sqlite3", "psycopg"):
        module = sys.modules.get(driver)
        if module is not None:
            kinds.append(module.Error)
    return tuple(kinds)


def _session_lost_in_psycopg(error: BaseException) -> bool:
    """A psycopg ``OperationalError`` with no SQLSTATE: the client lost the session.

    Every error the server reports carries a SQLSTATE; psycopg raises one
    without it only for the connection itself ("server closed the connection
    unexpectedly", "consuming input failed", a failed connect). Such a session
    may not even look broken afterwards (psycopg can report it idle, or Django
    may already have dropped it), so the error itself is the evidence.
    """
    try:
        import psycopg
    except ImportError:  # a SQLite-only installation
        return False
    return isinstance(error, psycopg.OperationalError) and not getattr(error, "sqlstate", None)


def sqlstate_of(error: BaseException) -> str | None:
    """The SQLSTATE the server (or psycopg) gave the error, if any (SQLite has none)."""
    for link in _chain(error):
        state = getattr(link, "sqlstate", None)
        if isinstance(state, str) and state:
            return state
    return None


def _a_connection_is_gone() -> bool:
    """Whether a connection this thread opened was lost (psycopg marks it broken or closed)."""
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is not None and (getattr(raw, "broken", False) or getattr(raw, "closed", False)):
            return True
    return False


def database_answers(alias: str = "default") -> bool:
    """The worker's own health check: does a brand-new connection answer ``SELECT 1``?

    A new connection, not this thread's: the thread's may be the very one an
    operation broke. Bounded by ``HEALTH_CHECK_SECONDS`` on PostgreSQL (connect
    and statement); a SQLite file answers or fails at once.
    """
    base = connections[alias]
    settings = copy.deepcopy(base.settings_dict)
    if base.vendor == "postgresql":
        options = dict(settings.get("OPTIONS") or {})
        options.pop("pool", None)  # one plain connection, not a pool of them
        options["connect_timeout"] = HEALTH_CHECK_SECONDS
        settings["OPTIONS"] = options
    probe = type(base)(settings, alias=f"{alias}-health")
    try:
        with probe.cursor() as cursor:
            if probe.vendor == "postgresql":
                # SET LOCAL in a transaction: a plain SET would outlive the probe
                # on a transaction pooler's server connection (jobs.pooling).
                probe.set_autocommit(False)
                cursor.execute(f"SET LOCAL statement_timeout = {HEALTH_CHECK_SECONDS * 1000}")
            cursor.execute("SELECT 1")
            answered = cursor.fetchone() is not None
            if probe.vendor == "postgresql":
                probe.rollback()
            return answered
    except Exception:  # noqa: BLE001 - any failure to answer is the answer
        return False
    finally:
        try:
            probe.close()
        except Exception:  # noqa: BLE001 - closing what never opened
            pass


def is_outage(error: BaseException, *, health_check: Callable[[], bool] = database_answers) -> bool:
    """Whether a database error raised inside an operation means the database went away.

    Decided by evidence, most direct first:

    1. The SQLSTATE, when the server gave one: class 08, 57P01-57P03 or 53300
       are an outage; anything else (57014 statement timeout, 42P01 missing
       table, 42601 syntax error, 40P01 deadlock, 55P03 lock timeout …) is the
       operation's own failure, counted against its attempts.
    2. A psycopg ``OperationalError`` without SQLSTATE (the client lost the
       session), an ``InterfaceError`` (a connection used after it closed),
       psycopg's "received 2 results from command" on a connection a pooler
       then closed (``workers.pooler_outages``), or a connection of this
       thread that psycopg marks broken or closed.
    3. Otherwise (SQLite, which has no SQLSTATE; a failed connect), the
       worker's health check: a database that still answers a new connection
       did not go away, so the error is the operation's.

    An error that is not a database error is judged by the database error it
    was raised from (an operation may wrap one), and is never an outage without one.
    """
    kinds = _database_error_types()
    database_error = next((link for link in _chain(error) if isinstance(link, kinds)), None)
    if database_error is None:
        return False
    state = sqlstate_of(database_error)
    if state is not None:
        return state.startswith(OUTAGE_SQLSTATE_CLASSES) or state in OUTAGE_SQLSTATES
    if any(
        isinstance(link, InterfaceError)
        or _session_lost_in_psycopg(link)
        or session_lost_behind_pooler(link)
        for link in _chain(database_error)
    ):
        return True
    if _a_connection_is_gone():
        return True
    return not health_check()


def describe(error: BaseException, limit: int = 500) -> str:
    """``Type: first line of the message``, short enough for an event and an error message."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    described = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return described if len(described) <= limit else described[: limit - 1] + "…"


def backoff_delay(attempt: int) -> float:
    """Exponential backoff with ±25% jitter, capped by DB_RETRY_MAX_SECONDS."""
    base = float(knob("DB_RETRY_INITIAL_SECONDS")) * (2 ** min(max(attempt, 0), 32))
    base = min(base, float(knob("DB_RETRY_MAX_SECONDS")))
    return base * random.uniform(0.75, 1.25)


def reset_connection() -> None:
    """Close this thread's connections so the next query reconnects (after an error)."""
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block:
            continue
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - closing a dead connection may itself fail
            conn.connection = None


def with_db_retry[T](
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 5,
    sleep: Callable[[float], object] | None = None,
    give_up: Callable[[], bool] | None = None,
) -> T:
    """Run ``fn``, retrying transient database errors ``attempts`` times with backoff.

    With ``give_up``, retries go on past ``attempts`` for as long as it returns
    False: a job's outcome is worth waiting for through a long restart, since
    the alternative is a job left running until its lease expires.
    """
    import time

    sleeper = sleep or time.sleep
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as error:
            if not is_transient(error):
                raise
            if attempt >= attempts - 1 and (give_up is None or give_up()):
                raise
            delay = backoff_delay(attempt)
            log.warning(
                "db.retry what=%s attempt=%d delay=%.2fs error=%s", what, attempt + 1, delay, error
            )
            reset_connection()
            sleeper(delay)
            attempt += 1
