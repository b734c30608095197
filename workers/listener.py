"""Wake-up hints from PostgreSQL ``LISTEN``/``NOTIFY``.

A NOTIFY carries only a queue name and is a hint: the worker always claims
from the table, and polls every ``POLL_SECONDS`` anyway, so a lost
notification costs latency, never a job. The listener owns one dedicated
connection, checks its health while idle and reconnects with backoff. Behind
a transaction pooler that connection goes to ``DATABASE_DIRECT_URL``
(``jobs.pooling``); without one the worker only polls.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable

import psycopg
from django.db import connections

from jobs.conf import knob
from jobs.pooling import session_conninfo
from jobs.wakeups import NOTIFY_CHANNEL
from workers.liveness import hold_liveness_lock
from workers.resilience import backoff_delay

log = logging.getLogger("workers")


def can_listen(alias: str = "default") -> bool:
    """PostgreSQL with a session to LISTEN on (not only a transaction pooler: ``jobs.pooling``)."""
    return connections[alias].vendor == "postgresql" and session_conninfo(alias) is not None


class NotifyListener:
    """A daemon thread that sets ``wake`` when a NOTIFY names one of ``queues``.

    With ``worker_id``, its connection also holds that worker's liveness lock
    (``workers.liveness``), and a lost connection is retried at least every
    ``LIVENESS_RECONNECT_SECONDS`` so a live worker is never taken for a dead one.
    """

    def __init__(
        self,
        queues: Iterable[str],
        wake: threading.Event,
        *,
        worker_id: uuid.UUID | None = None,
        health_seconds: float = 5.0,
    ) -> None:
        self.queues = set(queues)
        self.wake = wake
        self.worker_id = worker_id
        self.health_seconds = health_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-listener", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                params = session_conninfo()
                if params is None:
                    raise RuntimeError("No direct connection to LISTEN on (DATABASE_DIRECT_URL).")
                with psycopg.connect(autocommit=True, connect_timeout=5, **params) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    locked = self.worker_id is None or hold_liveness_lock(conn, self.worker_id)
                    self.connected.set()
                    failures = 0
                    # Anything enqueued while we were away is found by the next claim.
                    self.wake.set()
                    while not self._stop.is_set():
                        # Until the lock is ours (our previous session is still ending), retry soon.
                        timeout = self.health_seconds if locked else 0.1
                        for note in conn.notifies(timeout=timeout, stop_after=64):
                            if note.payload in self.queues:
                                self.wake.set()
                        conn.execute("SELECT 1")  # health check while idle
                        if not locked and self.worker_id is not None:
                            locked = hold_liveness_lock(conn, self.worker_id)
            except Exception as error:  # noqa: BLE001 - any failure means reconnect
                self.connected.clear()
                delay = backoff_delay(failures)
                if self.worker_id is not None:
                    delay = min(delay, float(knob("LIVENESS_RECONNECT_SECONDS")))
                failures += 1
                log.warning("listener.reconnect delay=%.2fs error=%s", delay, error)
                self.wake.set()
                self._stop.wait(delay)
