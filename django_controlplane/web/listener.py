"""One PostgreSQL ``LISTEN`` connection per process, shared by every relay.

The remote-worker relay (``controlplane_jobs``: a queue may have a claimable
job) and the dashboard relay (``controlplane_events``: new job events) both
want notifications. Rather than each holding its own connection, they
subscribe a callback here; a single daemon thread owns one autocommit
connection, ``LISTEN``\\s on every subscribed channel and calls the callbacks
from that thread (callbacks must be quick and thread-safe: set an event,
schedule on a loop).

A notification is only a hint. While the connection is down (a database
restart) nothing arrives; every subscriber therefore keeps its own slower
poll, and ``on_connect`` callbacks run whenever their channel starts being
listened to (each (re)connection, and a channel subscribed while the thread is
already connected), so a subscriber can look for what was sent before the
``LISTEN`` took effect.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from jobs.pooling import session_conninfo

log = logging.getLogger("django_controlplane.remote")

IDLE_CHECK_SECONDS = 1.0  # how soon a new channel is LISTENed to; also the idle health check
RETRY_SECONDS = 2.0

Handler = Callable[[str], None]


class Listener:
    """The process's LISTEN thread. ``subscribe`` starts it on first use."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._lock = threading.Lock()
        self._handlers: dict[str, list[Handler]] = {}
        self._on_connect: dict[str, list[Callable[[], None]]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.connected = threading.Event()
        self.connections = 0  # opened so far: for tests and diagnostics

    @property
    def available(self) -> bool:
        """True on PostgreSQL with a session to LISTEN on; else there is nothing to hear.

        Behind a transaction pooler without ``DATABASE_DIRECT_URL`` there is
        no such session (``jobs.pooling``): subscribers poll instead.
        """
        return connections[self.using].vendor == "postgresql" and (
            session_conninfo(self.using) is not None
        )

    def subscribe(
        self, channel: str, handler: Handler, on_connect: Callable[[], None] | None = None
    ) -> None:
        """Call ``handler(payload)`` for every NOTIFY on ``channel`` (from the listener thread).

        ``on_connect`` runs (on that thread) each time ``channel`` starts being
        listened to: NOTIFYs sent before that moment were not heard.
        """
        with self._lock:
            self._handlers.setdefault(channel, []).append(handler)
            if on_connect is not None:
                self._on_connect.setdefault(channel, []).append(on_connect)
        self.ensure_running()

    def ensure_running(self) -> None:
        """Start the thread unless it runs (after ``stop()``, subscriptions are kept)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping.clear()
                self._thread = threading.Thread(
                    target=self._run, name="controlplane-listen", daemon=True
                )
                self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the connection and end the thread (tests: before the database is dropped)."""
        with self._lock:
            thread = self._thread
            self._stopping.set()
        if thread is not None:
            thread.join(timeout)

    def unsubscribe(self, channel: str, handler: Handler) -> None:
        with self._lock:
            handlers = self._handlers.get(channel, [])
            if handler in handlers:
                handlers.remove(handler)

    # --- the thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception:  # noqa: BLE001 - the listener must outlive database hiccups
                log.warning("The LISTEN connection failed; reconnecting.", exc_info=True)
            self.connected.clear()
            self._stopping.wait(RETRY_SECONDS)

    def _listen(self) -> None:
        # A connection of its own, outside Django's pool and past any
        # transaction pooler: LISTEN needs the same session for as long as the process lives.
        import psycopg

        params = session_conninfo(self.using)
        if params is None:
            raise RuntimeError("No direct connection to LISTEN on (set DATABASE_DIRECT_URL).")
        conn = psycopg.connect(**params, autocommit=True)
        listening: set[str] = set()
        try:
            self.connections += 1
            first = True
            while not self._stopping.is_set():
                with self._lock:
                    wanted = set(self._handlers) - listening
                for channel in sorted(wanted):
                    conn.execute(f'LISTEN "{channel}"')
                    listening.add(channel)
                if first:
                    first = False
                    self.connected.set()
                with self._lock:
                    catch_up = [c for ch in sorted(wanted) for c in self._on_connect.get(ch, ())]
                for callback in catch_up:
                    _safely(callback)
                for note in conn.notifies(timeout=IDLE_CHECK_SECONDS):
                    with self._lock:
                        handlers = list(self._handlers.get(note.channel, ()))
                    for handler in handlers:
                        _safely(handler, note.payload)
                conn.execute("SELECT 1")  # a health check while idle
        finally:
            self.connected.clear()
            conn.close()


def _safely(callback: Callable[..., None], *args: Any) -> None:
    try:
        callback(*args)
    except Exception:  # noqa: BLE001 - one subscriber's bug must not stop the others
        log.exception("A LISTEN subscriber failed.")


listener = Listener()
