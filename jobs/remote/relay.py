"""One wake-up source per web process: "a job may be claimable on queue Q".

Long-polling claims (sync view threads) and worker WebSockets (Channels
consumers) both wait for the same signal, so each web process runs a single
relay thread rather than one listener per request or per socket:

* on PostgreSQL it subscribes to ``jobs.enqueue.NOTIFY_CHANNEL`` (enqueue
  sends the queue name at commit) on the process's shared LISTEN connection
  (``jobs.remote.listener``, also used by the dashboard relay);
* on SQLite it polls one cheap aggregate (every ``POLL_SECONDS``, at most
  0.5 s) and signals a queue when its claimable count or newest ``run_after`` grew.

The signal is only a hint: waiters claim from the table, and every waiter
also wakes on its own timeout, so a lost notification costs latency, never a job.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from django.db import close_old_connections
from django.utils import timezone

from jobs.conf import knob
from jobs.remote.listener import listener

log = logging.getLogger("jobs.remote")

GROUP_PREFIX = "jobs.queue."
RELAY_POLL_MAX_SECONDS = 0.5
_SAFE_GROUP = re.compile(r"[A-Za-z0-9_.\-]{1,80}")


def queue_group(queue: str) -> str:
    """The Channels group of a queue (group names allow few characters; hash the rest)."""
    if _SAFE_GROUP.fullmatch(queue):
        return GROUP_PREFIX + queue
    return GROUP_PREFIX + "h" + hashlib.sha1(queue.encode()).hexdigest()[:20]


class Relay:
    """Fans queue wake-ups out to waiting threads and to Channels groups."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[frozenset[str], threading.Event]] = []
        self._groups: Counter[str] = Counter()  # queue -> subscribed sockets
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._seen: dict[str, tuple[int, datetime | None]] = {}
        self._started = False

    # --- subscribers --------------------------------------------------------

    def wait(self, queues: Iterable[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a wake-up on any of ``queues``."""
        self.ensure_started()
        entry = (frozenset(queues), threading.Event())
        with self._lock:
            self._waiters.append(entry)
        try:
            return entry[1].wait(max(0.0, timeout))
        finally:
            with self._lock:
                self._waiters.remove(entry)

    def subscribe_groups(self, queues: Iterable[str], loop: asyncio.AbstractEventLoop) -> None:
        """Count a socket's interest in ``queues``; its consumer joins the groups itself."""
        with self._lock:
            self._loop = loop
            self._groups.update(set(queues))
        self.ensure_started()

    def unsubscribe_groups(self, queues: Iterable[str]) -> None:
        with self._lock:
            self._groups.subtract(set(queues))
            self._groups = +self._groups  # drop zero counts

    def subscribed_queues(self) -> set[str]:
        with self._lock:
            return set(self._groups) | {q for queues, _ in self._waiters for q in queues}

    # --- fan-out ------------------------------------------------------------

    def publish(self, queues: Iterable[str]) -> None:
        """Wake everyone waiting on any of ``queues`` (called by the relay thread, or tests)."""
        queues = set(queues)
        if not queues:
            return
        with self._lock:
            for interest, event in self._waiters:
                if interest & queues:
                    event.set()
            loop = self._loop
            pushed = [q for q in queues if self._groups.get(q)]
        if loop is not None and pushed and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._group_send(pushed), loop)

    @staticmethod
    async def _group_send(queues: list[str]) -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        for queue in queues:
            await layer.group_send(queue_group(queue), {"type": "job.available", "queue": queue})

    # --- the thread ---------------------------------------------------------

    def ensure_started(self) -> None:
        with self._lock:
            if self._started:
                if listener.available:
                    listener.ensure_running()
                return
            self._started = True
        if listener.available:
            from jobs.enqueue import NOTIFY_CHANNEL

            # Anything enqueued while the connection was down is found by the waiters' own polls.
            listener.subscribe(NOTIFY_CHANNEL, lambda queue: self.publish({queue}))
            return
        with self._lock:
            self._thread = threading.Thread(target=self._run, name="remote-relay", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._poll_forever()
            except Exception:  # noqa: BLE001 - the relay must outlive database hiccups
                log.warning("The job relay lost its database connection; retrying.", exc_info=True)
                close_old_connections()
                time.sleep(min(5.0, float(knob("POLL_SECONDS"))))

    def _poll_forever(self) -> None:
        # One cheap aggregate per web process, so it can afford to look often.
        while True:
            self.poll_once()
            time.sleep(min(float(knob("POLL_SECONDS")), RELAY_POLL_MAX_SECONDS))

    def poll_once(self) -> set[str]:
        """SQLite: signal queues whose claimable count or newest ``run_after`` grew."""
        from django.db.models import Count, Max

        from jobs.models import Job

        queues = self.subscribed_queues()
        if not queues:
            return set()
        rows = (
            Job.objects.filter(status="queued", queue__in=queues, run_after__lte=timezone.now())
            .values("queue")
            .annotate(n=Count("id"), newest=Max("run_after"))
            .order_by()
        )
        rows = list(rows)
        grown = set()
        for row in rows:
            before_n, before_newest = self._seen.get(row["queue"], (0, None))
            if row["n"] > before_n or (before_newest is None or row["newest"] > before_newest):
                grown.add(row["queue"])
            self._seen[row["queue"]] = (row["n"], row["newest"])
        for queue in set(self._seen) - {r["queue"] for r in rows}:
            self._seen.pop(queue)
        self.publish(grown)
        return grown


relay = Relay()
