"""One wake-up source per web process: "a job may be claimable on queue Q".

Long-polling claims (async views, parked on the event loop) and worker
WebSockets (Channels consumers) both wait for the same signal, so each web
process runs a single relay rather than one listener per request or socket:

* on PostgreSQL it subscribes to ``jobs.wakeups.NOTIFY_CHANNEL`` (enqueue
  sends the queue name at commit) on the process's shared LISTEN connection
  (``django_controlplane.web.listener``, also used by the dashboard relay), and every
  ``POLL_SECONDS`` it also wakes parked claims (jobs whose ``run_after`` came
  due send no notification);
* on SQLite it polls one cheap aggregate (every ``POLL_SECONDS``, at most
  0.5 s) and signals a queue when its claimable count or newest ``run_after`` grew.

Parked claims are woken one at a time (a *wake round*), not all at once: a
thousand remote workers waiting on one queue and one new job must cost one
or two claim attempts, not a thousand. The woken claim tries; if it got
jobs it passes the round on (there may be more), and if it got none, no
other claim of the same kind (same queues and operations) is woken by this
round. The signal is only a hint: a claim that is never woken answers empty
when its ``wait`` is up, and the client asks again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import close_old_connections

from django_controlplane.web.listener import listener
from jobs.clock import DatabaseNow
from jobs.conf import knob

log = logging.getLogger("django_controlplane.remote")

GROUP_PREFIX = "jobs.queue."
RELAY_POLL_MAX_SECONDS = 0.5
_SAFE_GROUP = re.compile(r"[A-Za-z0-9_.\-]{1,80}")


def queue_group(queue: str) -> str:
    """The Channels group of a queue (group names allow few characters; hash the rest)."""
    if _SAFE_GROUP.fullmatch(queue):
        return GROUP_PREFIX + queue
    return GROUP_PREFIX + "h" + hashlib.sha1(queue.encode()).hexdigest()[:20]


@dataclass(eq=False)
class WakeRound:
    """One wake-up, handed from parked claim to parked claim until it finds nothing."""

    queues: frozenset[str]
    exhausted: set[Hashable] = field(default_factory=set)  # kinds that found nothing


@dataclass(eq=False)
class Waiter:
    queues: frozenset[str]
    kind: Hashable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[WakeRound]
    wake: WakeRound | None = None  # the round that reached it


def _resolve(future: asyncio.Future[WakeRound], wake: WakeRound) -> None:
    if not future.done():
        future.set_result(wake)


class Relay:
    """Wakes parked claims (one at a time) and pushes to Channels groups."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[Waiter] = []
        self._groups: Counter[str] = Counter()  # queue -> subscribed sockets
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._seen: dict[str, tuple[int, datetime | None]] = {}
        self._running_seen: dict[str, int] = {}  # SQLite: running jobs per queue at the last look
        self._started = False

    # --- parked claims ------------------------------------------------------

    async def wait(self, queues: Iterable[str], kind: Hashable, timeout: float) -> WakeRound | None:
        """Park until a wake round reaches this claim, or ``timeout`` seconds pass (None).

        The caller tries to claim and then reports with ``finished``; if it is
        cancelled before it can, the round goes on without it.
        """
        self.ensure_started()
        loop = asyncio.get_running_loop()
        waiter = Waiter(frozenset(queues), kind, loop, loop.create_future())
        with self._lock:
            self._waiters.append(waiter)
        delivered = False
        try:
            wake = await asyncio.wait_for(waiter.future, max(0.0, timeout))
            delivered = True
            return wake
        except TimeoutError:
            return None
        finally:
            with self._lock:
                self._waiters.remove(waiter)
                if waiter.wake is not None and not delivered:
                    # Reached by a round it can no longer serve (timed out, client gone).
                    self._wake_next(waiter.wake)
            waiter.future.cancel()

    def finished(self, wake: WakeRound, kind: Hashable, *, claimed: bool | None) -> None:
        """A woken claim tried: pass the round on (``claimed=None``: it could not try)."""
        with self._lock:
            if claimed is False:
                wake.exhausted.add(kind)
            self._wake_next(wake)

    def _wake_next(self, wake: WakeRound) -> None:
        for waiter in self._waiters:
            if waiter.wake is not None or waiter.future.done():
                continue  # already reached by a round (this one or another)
            if not (waiter.queues & wake.queues) or waiter.kind in wake.exhausted:
                continue
            waiter.wake = wake
            if not waiter.loop.is_closed():
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future, wake)
            return

    def wake(self, queues: Iterable[str]) -> None:
        """Start a wake round among the claims parked on any of ``queues``."""
        queues = frozenset(queues)
        if queues:
            with self._lock:
                self._wake_next(WakeRound(queues))

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
            return set(self._groups) | self._waiting_queues()

    def _waiting_queues(self) -> set[str]:
        return {q for waiter in self._waiters for q in waiter.queues}

    def waiting(self) -> int:
        """How many claims are parked in this process (tests, diagnostics)."""
        with self._lock:
            return len(self._waiters)

    # --- fan-out ------------------------------------------------------------

    def publish(self, queues: Iterable[str]) -> None:
        """A job may be claimable on ``queues``: wake a parked claim, push to sockets."""
        queues = set(queues)
        if not queues:
            return
        self.wake(queues)
        with self._lock:
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
            from jobs.wakeups import NOTIFY_CHANNEL

            # After a reconnection, whatever was enqueued meanwhile: wake everyone's queues.
            listener.subscribe(
                NOTIFY_CHANNEL,
                lambda queue: self.publish({queue}),
                on_connect=lambda: self.publish(self.subscribed_queues()),
            )
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
        if listener.available:
            # NOTIFY covers enqueues; this covers jobs that came due (run_after,
            # retry backoff) with no notification: a round per tick, no query here.
            while True:
                time.sleep(float(knob("POLL_SECONDS")))
                with self._lock:
                    queues = self._waiting_queues()
                self.wake(queues)
        # SQLite: one cheap aggregate per web process, so it can afford to look often.
        while True:
            self.poll_once()
            time.sleep(min(float(knob("POLL_SECONDS")), RELAY_POLL_MAX_SECONDS))

    def poll_once(self) -> set[str]:
        """SQLite: signal queues whose claimable count or newest ``run_after`` grew, or
        whose running jobs fell while jobs wait (a key's or a cap's slot came free)."""
        from django.db.models import Count, Max

        from jobs.models import Job

        queues = self.subscribed_queues()
        if not queues:
            return set()
        rows = (
            Job.objects.filter(status="queued", queue__in=queues, run_after__lte=DatabaseNow())
            .values("queue")
            .annotate(n=Count("id"), newest=Max("run_after"))
            .order_by()
        )
        rows = list(rows)
        running = dict(
            Job.objects.filter(status="running", queue__in=[r["queue"] for r in rows])
            .values("queue")
            .annotate(n=Count("id"))
            .order_by()
            .values_list("queue", "n")
        )
        grown = set()
        for row in rows:
            queue = row["queue"]
            before_n, before_newest = self._seen.get(queue, (0, None))
            if row["n"] > before_n or (before_newest is None or row["newest"] > before_newest):
                grown.add(queue)
            if running.get(queue, 0) < self._running_seen.get(queue, 0):
                grown.add(queue)
            self._seen[queue] = (row["n"], row["newest"])
            self._running_seen[queue] = running.get(queue, 0)
        for queue in set(self._seen) - {r["queue"] for r in rows}:
            self._seen.pop(queue)
            self._running_seen.pop(queue, None)
        self.publish(grown)
        return grown


relay = Relay()
