"""Waking idle workers: one NOTIFY per queue that gained claimable work (PostgreSQL).

Enqueue, retries, requeues and resumed queues all end here; workers and the
remote-worker relay LISTEN on ``NOTIFY_CHANNEL``. SQLite has no NOTIFY: there
workers poll (``POLL_SECONDS``).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from jobs.dialect import dialect

NOTIFY_CHANNEL = "controlplane_jobs"
# Sent by the trigger on every statement that inserts job events (jobs migration 0002):
# the dashboard relay, the API's end waiters and ``jobs.awaiting`` listen on it.
EVENTS_CHANNEL = "controlplane_events"


def notify_queues(queues: Sequence[str], *, using: str = "default") -> None:
    """Wake workers of ``queues`` (PostgreSQL only; a no-op on SQLite, where workers poll)."""
    if dialect(using).postgres and queues:
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) AS q",
                [sorted(set(queues))],
            )
