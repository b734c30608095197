"""Surviving database trouble: which errors are transient, and how long to back off.

A worker never dies because the database restarted or the network dropped:
it backs off exponentially with jitter (capped) and resumes when the
database answers again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from jobs.conf import knob

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
    """Deadlocks, serialization failures, dropped connections, a busy SQLite file."""
    if isinstance(error, (OperationalError, InterfaceError)):
        return True
    cause = getattr(error, "__cause__", None)
    sqlstate = getattr(cause, "sqlstate", None)
    return isinstance(error, DatabaseError) and sqlstate in TRANSIENT_SQLSTATES


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
