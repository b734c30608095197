"""Parked "tell me when it ends" requests of one web process: ``GET /jobs/<id>?wait=S``.

A long-poll for a job's (or a workflow's) end parks on the event loop holding
no thread and no database connection, as parked claims do
(``django_controlplane.remote.claim_view``). One registry per process keeps
them: a dict from ``(kind, id)`` to the futures waiting on it. A single
daemon thread checks, in ONE query for every parked request
(``ended_among``), which of the watched jobs and workflows have ended, and
resolves their futures; a thousand parked requests cost one query per check,
not a thousand.

When it checks:

* on PostgreSQL, when ``controlplane_events`` fires (the trigger of jobs
  migration 0002 sends it for every statement that inserts job events, and
  every end of a job writes one, as does the step end that settles a
  workflow), heard on the process's shared LISTEN connection
  (``django_controlplane.web.listener``); checks are coalesced (at most one
  every ``MIN_GAP_SECONDS``) and, as a notification is only a hint, made
  anyway every ``SAFETY_RECHECK_SECONDS``;
* on SQLite (or behind a pooler with no session to LISTEN on) every
  ``POLL_SECONDS``, at most ``SQLITE_POLL_SECONDS``, while anything is parked;
* always, soon after a new request parks: the end may have come between the
  view's first read and its parking, before anyone watched for it.

The thread hands its connection back after each check (to Django's pool, or
closes it), so idle parked requests hold none. A wake-up is only a hint too:
the view reads the row again and answers what it finds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import close_old_connections, connections

from django_controlplane.web.listener import listener
from jobs.conf import knob
from jobs.wakeups import EVENTS_CHANNEL

log = logging.getLogger("django_controlplane.api")

JOB = "job"
WORKFLOW = "workflow"
MIN_GAP_SECONDS = 0.02
SAFETY_RECHECK_SECONDS = 2.0
SQLITE_POLL_SECONDS = 0.5
# Ids per statement: SQLite's bound parameters are limited (32,766 by default).
CHUNK = 5000
JOB_ENDED = ("succeeded", "failed", "cancelled")
WORKFLOW_ENDED = ("succeeded", "failed", "cancelled")

Key = tuple[str, uuid.UUID]


@dataclass(eq=False)
class _Parked:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[bool]


@dataclass
class _Stats:
    checks: int = 0  # queries made (tests, diagnostics)
    woken: int = 0
    errors: int = 0


def ended_among(job_ids: Iterable[uuid.UUID], workflow_ids: Iterable[uuid.UUID]) -> set[Key]:
    """Which of these jobs and workflows have ended: one statement for all of them
    (per ``CHUNK`` ids of each kind), a ``UNION ALL`` of the two tables' primary keys."""
    from jobs.models import Job, Workflow

    jobs, workflows = sorted(set(job_ids)), sorted(set(workflow_ids))
    found: set[Key] = set()
    while jobs or workflows:
        job_part, jobs = jobs[:CHUNK], jobs[CHUNK:]
        flow_part, workflows = workflows[:CHUNK], workflows[CHUNK:]
        parts = []
        if job_part:
            parts.append(
                Job.objects.filter(pk__in=job_part, status__in=JOB_ENDED)
                .order_by()
                .values_list("pk", flat=True)
            )
        if flow_part:
            parts.append(
                Workflow.objects.filter(pk__in=flow_part, status__in=WORKFLOW_ENDED)
                .order_by()
                .values_list("pk", flat=True)
            )
        query = parts[0] if len(parts) == 1 else parts[0].union(parts[1], all=True).order_by()
        job_set = set(job_part)
        for pk in query:  # job and workflow ids are UUIDs drawn apart: never the same
            pk = pk if isinstance(pk, uuid.UUID) else uuid.UUID(str(pk))
            found.add((JOB, pk) if pk in job_set else (WORKFLOW, pk))
    return found


class EndWaiters:
    """The process's parked long-polls for ends, and the thread that wakes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parked: dict[Key, list[_Parked]] = {}
        self._due = threading.Event()  # a check is wanted (a NOTIFY, a new request)
        self._thread: threading.Thread | None = None
        self._subscribed = False
        self.stats = _Stats()

    async def wait(self, kind: str, object_id: uuid.UUID, timeout: float) -> bool:
        """Park until ``kind`` ``object_id`` has ended (True) or ``timeout`` passes (False)."""
        if timeout <= 0:
            return False
        self.ensure_started()
        loop = asyncio.get_running_loop()
        parked = _Parked(loop, loop.create_future())
        key = (kind, object_id)
        with self._lock:
            self._parked.setdefault(key, []).append(parked)
        self._due.set()  # it may have ended before it was watched: look once now
        try:
            return await asyncio.wait_for(parked.future, timeout)
        except TimeoutError:
            return False
        finally:
            with self._lock:
                waiting = self._parked.get(key, [])
                if parked in waiting:
                    waiting.remove(parked)
                if not waiting:
                    self._parked.pop(key, None)

    def parked(self) -> int:
        """How many requests are parked in this process (tests, diagnostics)."""
        with self._lock:
            return sum(len(v) for v in self._parked.values())

    # --- checking -----------------------------------------------------------------

    def check_once(self) -> set[Key]:
        """Look up every watched id in one query and wake the requests whose object ended."""
        with self._lock:
            keys = list(self._parked)
        if not keys:
            return set()
        ended = ended_among(
            (i for kind, i in keys if kind == JOB), (i for kind, i in keys if kind == WORKFLOW)
        )
        self.stats.checks += 1
        if ended:
            self._wake(ended)
        return ended

    def _wake(self, ended: set[Key]) -> None:
        with self._lock:
            reached = [p for key in ended for p in self._parked.get(key, ())]
        for parked in reached:
            if not parked.loop.is_closed():
                parked.loop.call_soon_threadsafe(_resolve, parked.future)
        self.stats.woken += len(reached)

    def _notified(self, _payload: str = "") -> None:
        if self._parked:  # nothing watched: nothing to look up (read without the lock: a hint)
            self._due.set()

    # --- the thread ---------------------------------------------------------------

    def ensure_started(self) -> None:
        with self._lock:
            running = self._thread is not None and self._thread.is_alive()
            subscribe = not self._subscribed and listener.available
            self._subscribed = self._subscribed or subscribe
            if not running:
                self._thread = threading.Thread(target=self._run, name="end-waiters", daemon=True)
                self._thread.start()
        if subscribe:
            listener.subscribe(EVENTS_CHANNEL, self._notified, on_connect=self._notified)
        elif self._subscribed:
            listener.ensure_running()

    def _interval(self) -> float:
        if listener.available and listener.connected.is_set():
            return SAFETY_RECHECK_SECONDS
        return min(float(knob("POLL_SECONDS")), SQLITE_POLL_SECONDS)

    def _run(self) -> None:
        while True:
            self._due.wait(self._interval())
            self._due.clear()
            if not self._parked:
                continue
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - the waiters must outlive database hiccups
                self.stats.errors += 1
                log.warning("Checking parked waits failed; retrying.", exc_info=True)
                close_old_connections()
                time.sleep(SQLITE_POLL_SECONDS)
            finally:
                # Hand the connection back: between checks this thread holds none.
                connections.close_all()
            time.sleep(MIN_GAP_SECONDS)  # coalesce a burst of notifications into one check


def _resolve(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(True)


end_waiters = EndWaiters()
