"""Telling a dead local worker from a slow one within seconds (PostgreSQL).

A lease alone rescues a ``kill -9``'d worker's jobs only once the lease runs
out and the reaper's next pass comes by: up to ``LEASE_SECONDS`` +
``REAPER_INTERVAL_SECONDS`` (a minute by default). But PostgreSQL learns of
the death at once: the kernel closes the dead process's sockets and its
sessions end. So each local worker holds a session-level advisory lock on its
own id, on its long-lived LISTEN connection, and marks its row
``liveness_lock`` once it first holds it. The reaper checks every
``WORKER_LIVENESS_SECONDS`` which marked workers' locks nobody holds; a worker
whose lock stays free for ``WORKER_LOST_SECONDS`` is gone, and its jobs
follow the expired-lease rules at once.

The grace covers a live worker whose session was cut (``pg_terminate_backend``,
a pooler restart): its listener reconnects and takes the lock again within
``LIVENESS_RECONNECT_SECONDS``, well inside the grace. A worker cut off from
the database for longer than the grace loses its jobs as it would at lease
expiry, only sooner; its lease tokens fence it off, so it cannot finish them.
Workers that hold no lock (``POLL_ONLY``, SQLite, remote workers, rows
written by an older version) are left to their leases and heartbeats.

Behind a transaction pooler a session lock would stay on whichever server
connection took it, outliving the worker, so the LISTEN connection that
holds it goes to ``DATABASE_DIRECT_URL`` (``jobs.pooling.session_conninfo``);
without a direct URL a worker takes no lock. The reaper's check reads
``pg_locks`` in one statement and may go through the pooler.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg
from django.db import connection

from jobs.models import Worker, WorkerKind

# The advisory lock's first key: the two-key form keeps our locks apart from
# an application's own one-key advisory locks. (0x63706C76: "cplv".)
LOCK_CLASS = 0x63706C76
# The second key: the worker id's text hashed by PostgreSQL, so both sides compute it alike.
_KEY = "hashtext({}) & 2147483647"


def hold_liveness_lock(conn: psycopg.Connection[Any], worker_id: uuid.UUID) -> bool:
    """Take ``worker_id``'s liveness lock on ``conn`` (a psycopg autocommit connection) and
    mark the worker's row; False while another session still holds it (the worker's
    previous session, not yet ended)."""
    row = conn.execute(
        f"SELECT pg_try_advisory_lock(%s, {_KEY.format('%s')})", [LOCK_CLASS, str(worker_id)]
    ).fetchone()
    held = bool(row and row[0])
    if held:
        conn.execute(
            f"UPDATE {Worker._meta.db_table} SET liveness_lock = true "
            "WHERE id = %s AND NOT liveness_lock",
            [worker_id],
        )
    return held


def workers_without_liveness() -> list[uuid.UUID]:
    """Local workers that took a liveness lock and whose lock no session holds now."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT w.id FROM {Worker._meta.db_table} w "
            "WHERE w.kind = %s AND w.liveness_lock AND NOT EXISTS ("
            "  SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
            "  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "  AND l.classid = %s AND l.objsubid = 2"
            f"  AND l.objid = ({_KEY.format('w.id::text')})::oid)",
            [WorkerKind.LOCAL, LOCK_CLASS],
        )
        return [row[0] for row in cursor.fetchall()]


def forget_lost_workers(worker_ids: Iterable[uuid.UUID]) -> int:
    """Delete the rows of ``worker_ids`` whose lock is still free (one that came back stays)."""
    ids = list(worker_ids)
    if not ids:
        return 0
    still_gone = set(workers_without_liveness())
    deleted, _ = Worker.objects.filter(pk__in=[w for w in ids if w in still_gone]).delete()
    return deleted


class LivenessWatch:
    """The reaper's memory of when each worker's lock was first seen free."""

    def __init__(self, lost_after_seconds: float) -> None:
        self.lost_after_seconds = lost_after_seconds
        self._free_since: dict[uuid.UUID, float] = {}

    def lost(self, free_now: Iterable[uuid.UUID], now: float | None = None) -> list[uuid.UUID]:
        """Record which locks are free now; return the workers free for the whole grace."""
        now = time.monotonic() if now is None else now
        free = set(free_now)
        self._free_since = {w: self._free_since.get(w, now) for w in free}
        grace = self.lost_after_seconds
        return sorted(w for w, since in self._free_since.items() if now - since >= grace)

    def forget(self, worker_ids: Iterable[uuid.UUID] | None = None) -> None:
        """Drop what was seen (after rescuing ``worker_ids``, or all after an outage of our own)."""
        if worker_ids is None:
            self._free_since.clear()
        for w in worker_ids or ():
            self._free_since.pop(w, None)
