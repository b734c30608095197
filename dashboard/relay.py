"""One live-update relay per web process: reads new job events, fans out rendered HTML.

Workers write only to the database. Pages subscribe over a WebSocket; their
consumers register here. While at least one is registered, a single task
reads the ``JobEvent`` rows added since the last look (by primary key),
renders what the open pages show (once per role, not once per page) and
sends it to channel-layer groups. A hundred open pages cost one indexed read
per tick, not a hundred pollers; the task stops when the last page closes.

When does it read?

* PostgreSQL: a statement-level trigger (migration ``jobs.0002``) sends
  ``NOTIFY controlplane_events`` for every statement that inserts events.
  The relay hears it on the process's shared LISTEN connection
  (``django_controlplane.web.listener``), waits ``RELAY_DEBOUNCE_SECONDS`` so a burst of
  commits becomes one read, and reads. A safety read every
  ``RELAY_SAFETY_POLL_SECONDS`` covers a lost connection.
  Enqueues store no event row (``jobs.timeline``): the relay also hears the
  workers' wake-up ``NOTIFY`` (``jobs.wakeups``) and finds new jobs by their
  creation time (``dashboard.cursor.NewJobCursor``).
* SQLite (no NOTIFY): a read every ``RELAY_INTERVAL_SECONDS``.

What it reads comes from ``dashboard.cursor.EventCursor``: the rows after
its last id plus those that filled the ids it skipped over (a transaction
that commits after later ids were read), each reported once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from dashboard import detail as detail_reads
from dashboard import render, selectors
from dashboard.conf import setting
from dashboard.cursor import EventCursor, NewJobCursor, max_event_id
from dashboard.workflow_graph import max_boxes, step_boxes, workflow_graph
from django_controlplane.web.listener import listener
from jobs.events import JOB_ENQUEUED
from jobs.models import Job, Workflow
from jobs.selectors import JobFilters
from jobs.selectors.timeouts import bounded_reads
from jobs.selectors.workflows import dependents_in_workflow
from jobs.wakeups import EVENTS_CHANNEL
from jobs.wakeups import NOTIFY_CHANNEL as WAKEUP_CHANNEL
from jobs.workflows import step_counts

log = logging.getLogger("dashboard.relay")

SUMMARY_PAGES = ("overview", "workers", "queues")


def job_group(job_id: uuid.UUID | str) -> str:
    return f"dash.job.{uuid.UUID(str(job_id)).hex}"


LIST_GROUP = "dash.jobs"


def workflow_group(workflow_id: uuid.UUID | str) -> str:
    return f"dash.workflow.{uuid.UUID(str(workflow_id)).hex}"


def page_group(page: str) -> str:
    return f"dash.page.{page}"


@dataclass
class Subscription:
    """What one open page shows: its page kind and, for job pages and lists, which jobs
    (for a workflow page, which workflow)."""

    page: str
    role: str
    job_id: uuid.UUID | None = None
    workflow_id: uuid.UUID | None = None
    after: int = 0
    ids: set[str] = field(default_factory=set)
    filters: JobFilters | None = None


@dataclass
class Changes:
    """What one read of the event table found."""

    jobs: dict[uuid.UUID, int]  # job id -> highest new seq
    enqueued: list[uuid.UUID]
    full: bool = False  # a read hit BATCH: read again soon


class Relay:
    """The per-process relay. Consumers call ``add``/``remove``; the task runs itself."""

    def __init__(self) -> None:
        self.subscribers: dict[str, Subscription] = {}
        self.task: asyncio.Task | None = None
        self.cursor = EventCursor()
        self.new_jobs = NewJobCursor()
        self.wake: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listening = False
        self.notifications = 0  # heard from PostgreSQL: for tests and diagnostics
        self.job_seq: dict[uuid.UUID, int] = {}
        self.rendered_at: dict[str, float] = {}
        self.dirty: bool = False
        # Large workflows (counted, not drawn): when each was last rendered, and those
        # with changes not pushed yet (rendered at most every SUMMARY_REFRESH_SECONDS).
        self.workflow_rendered_at: dict[uuid.UUID, float] = {}
        self.workflows_pending: set[uuid.UUID] = set()
        self.ticks = 0  # for tests and diagnostics
        self.starts = 0

    # --- subscribers -------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def add(self, channel_name: str, sub: Subscription) -> None:
        """Register a page; start the task (after reading where the event table ends) if idle."""
        self.subscribers[channel_name] = sub
        if sub.page in SUMMARY_PAGES:
            self.rendered_at.pop(sub.page, None)  # a fresh render at the next tick
            if self.running and self.wake is not None:
                self.wake.set()  # which is now, not at the next NOTIFY
        if sub.job_id is not None:
            self.job_seq.setdefault(sub.job_id, sub.after)
        if not self.running:
            new_jobs = NewJobCursor()
            end = await database_sync_to_async(_starting_points)(new_jobs)
            if not self.running and self.subscribers:  # nobody started it meanwhile
                self.cursor = EventCursor(end)  # pages catch up on older events themselves
                self.new_jobs = new_jobs
                self.loop = asyncio.get_running_loop()
                self.wake = asyncio.Event()
                self._listen()
                self.starts += 1
                self.task = asyncio.get_running_loop().create_task(
                    self._run(), name="dashboard-relay"
                )

    def remove(self, channel_name: str) -> None:
        """Forget a page; stop the task when no page is left."""
        sub = self.subscribers.pop(channel_name, None)
        if (
            sub
            and sub.job_id is not None
            and not any(s.job_id == sub.job_id for s in self.subscribers.values())
        ):
            self.job_seq.pop(sub.job_id, None)
        if not self.subscribers and self.task is not None:
            self.task.cancel()
            self.task = None
            self.rendered_at.clear()
            self.workflow_rendered_at.clear()
            self.workflows_pending.clear()

    # --- waking up ---------------------------------------------------------
    def _listen(self) -> None:
        """Subscribe (once per process) to the event trigger's NOTIFY, on PostgreSQL."""
        if self.listening:
            listener.ensure_running()
        elif listener.available:
            listener.subscribe(EVENTS_CHANNEL, self.notify, on_connect=self.notify)
            listener.subscribe(WAKEUP_CHANNEL, self.notify)  # enqueues: no event row to trigger
            self.listening = True

    def notify(self, payload: str = "") -> None:
        """Called from the listener thread: wake the relay task on its own loop."""
        loop, wake = self.loop, self.wake
        if loop is None or wake is None or loop.is_closed() or not self.running:
            return
        self.notifications += 1
        try:
            loop.call_soon_threadsafe(wake.set)
        except RuntimeError:  # the loop closed meanwhile
            pass

    # --- the loop ----------------------------------------------------------
    async def _run(self) -> None:
        failures = 0
        while self.subscribers:
            assert self.wake is not None
            self.wake.clear()
            try:
                full = await self.tick()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # a database hiccup must not end live updates for good
                failures += 1
                full = False
                log.exception("Dashboard relay tick failed (%s in a row).", failures)
            if failures:
                delay = float(setting("RELAY_INTERVAL_SECONDS"))
                await asyncio.sleep(delay * min(2**failures, 60))
            elif full:  # a full batch: more rows are waiting
                await asyncio.sleep(float(setting("RELAY_DEBOUNCE_SECONDS")))
            elif not self.listening:
                await asyncio.sleep(float(setting("RELAY_INTERVAL_SECONDS")))
            else:
                await self._wait_for_notify()

    async def _wait_for_notify(self) -> None:
        """Sleep until a NOTIFY (then debounce), a summary page is due, or the safety poll."""
        assert self.wake is not None
        try:
            await asyncio.wait_for(self.wake.wait(), self._next_due())
        except TimeoutError:
            return
        await asyncio.sleep(float(setting("RELAY_DEBOUNCE_SECONDS")))

    def _next_due(self) -> float:
        """Seconds until the safety read, or sooner a summary page's periodic render."""
        due = float(setting("RELAY_SAFETY_POLL_SECONDS"))
        quiet_after = float(setting("SUMMARY_REFRESH_SECONDS"))
        at_least = float(setting("WORKERS_REFRESH_SECONDS"))
        now = time.monotonic()
        for page in {s.page for s in self.subscribers.values()} & set(SUMMARY_PAGES):
            since = now - self.rendered_at.get(page, 0.0)
            due = min(due, at_least - since)
            if self.dirty:
                due = min(due, quiet_after - since)
        if self.workflows_pending:
            since = now - min(self.workflow_rendered_at.get(w, 0.0) for w in self.workflows_pending)
            due = min(due, quiet_after - since)
        if self.cursor.holes:
            due = min(due, 1.0)  # a late commit sends its own NOTIFY; this is a backstop
        return max(due, 0.02)

    async def tick(self) -> bool:
        """One read of new events and the pushes it calls for; True if the batch was full."""
        self.ticks += 1
        snapshot = dict(self.subscribers)
        pushes, full = await database_sync_to_async(self._collect)(snapshot)
        layer = get_channel_layer()
        for group, message in pushes:
            await layer.group_send(group, message)
        return full

    # --- the work of one tick (runs in the database thread) ---------------
    def _collect(
        self, subs: dict[str, Subscription]
    ) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        # The pages' own statement timeout: a slow render fails this tick (logged,
        # retried later), it never holds the database.
        with bounded_reads():
            return self._collect_bounded(subs)

    def _collect_bounded(
        self, subs: dict[str, Subscription]
    ) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        changes = self._read_changes(
            new_jobs=any(s.page == "jobs" or s.page in SUMMARY_PAGES for s in subs.values())
        )
        if changes.jobs:
            self.dirty = True
        pushes: list[tuple[str, dict[str, Any]]] = []
        pushes += self._job_pushes(changes, subs)
        pushes += self._list_pushes(changes, subs)
        pushes += self._workflow_pushes(changes, subs)
        pushes += self._page_pushes(subs)
        return pushes, changes.full

    def _read_changes(self, *, new_jobs: bool = True) -> Changes:
        """The jobs whose events appeared since the last read (late commits included), and
        the new jobs if a page shows them (most have no stored enqueue event:
        ``jobs.timeline``)."""
        rows, full = self.cursor.read()
        if new_jobs:
            new = self.new_jobs.read()
        else:  # nobody shows them: start again from the moment somebody does
            new = []
            self.new_jobs.newest = None
        jobs: dict[uuid.UUID, int] = dict.fromkeys(new, 1)
        enqueued: dict[uuid.UUID, None] = dict.fromkeys(new)
        for _, job_id, seq, name in rows:
            jobs[job_id] = max(seq, jobs.get(job_id, 0))
            if name == JOB_ENQUEUED:
                enqueued[job_id] = None
        return Changes(jobs=jobs, enqueued=list(enqueued), full=full)

    def _job_pushes(self, changes: Changes, subs: dict[str, Subscription]):
        watched: dict[uuid.UUID, set[str]] = {}
        for sub in subs.values():
            if sub.job_id is not None:
                watched.setdefault(sub.job_id, set()).add(sub.role)
        for job_id in set(changes.jobs) & set(watched):
            detail = detail_reads.job_detail(job_id)
            if detail is None:
                continue
            after = self.job_seq.get(job_id, 0)
            events = detail_reads.events_after(job_id, after)
            entries = render.timeline_entries(events)
            if events:
                self.job_seq[job_id] = events[-1].seq
            head = {role: render.job_head(detail, role) for role in watched[job_id]}
            yield (
                job_group(job_id),
                {
                    "type": "job.update",
                    "job": str(job_id),
                    "entries": [[seq, str(html)] for seq, html in entries],
                    "head": head,
                },
            )

    def _list_pushes(self, changes: Changes, subs: dict[str, Subscription]):
        lists = [s for s in subs.values() if s.page == "jobs"]
        if not lists or not changes.jobs:
            return
        visible = set().union(*(s.ids for s in lists))
        roles = {s.role for s in lists}
        changed = [j for j in changes.jobs if str(j) in visible]
        rows: dict[str, dict[str, str]] = {}
        for job in selectors.job_rows(changed):
            rows[str(job.id)] = {role: str(render.rows_oob([job], role)) for role in roles}
        new: list[dict[str, Any]] = []
        limit = int(setting("RELAY_NEW_JOBS_MAX"))
        if changes.enqueued:
            with_payload = any(s.filters and s.filters.payload is not None for s in lists)
            new = _summaries(changes.enqueued[:limit], with_payload=with_payload)
        if rows or new:
            yield (
                LIST_GROUP,
                {
                    "type": "jobs.changed",
                    "rows": rows,
                    "new": new,
                    "many": len(changes.enqueued) > limit,
                },
            )

    def _workflow_pushes(self, changes: Changes, subs: dict[str, Subscription]):
        """Workflow pages whose steps changed: the head, and the changed boxes (with the
        steps waiting for them, whose counts moved) or, at most every
        ``SUMMARY_REFRESH_SECONDS``, a large workflow's counts (a change within that
        time is pushed when it is up: ``_next_due``)."""
        watched: dict[uuid.UUID, set[str]] = {}
        for sub in subs.values():
            if sub.workflow_id is not None:
                watched.setdefault(sub.workflow_id, set()).add(sub.role)
        self.workflows_pending &= set(watched)
        for gone in set(self.workflow_rendered_at) - set(watched):
            del self.workflow_rendered_at[gone]
        if not watched:
            return
        touched: dict[uuid.UUID, list[uuid.UUID]] = {}
        if changes.jobs:
            for job_id, workflow_id in Job.objects.filter(
                pk__in=list(changes.jobs), workflow_id__in=list(watched)
            ).values_list("pk", "workflow_id"):
                touched.setdefault(workflow_id, []).append(job_id)
        now = time.monotonic()
        every = float(setting("SUMMARY_REFRESH_SECONDS"))
        for workflow_id in self.workflows_pending:
            touched.setdefault(workflow_id, [])
        for workflow_id, steps in touched.items():
            workflow = Workflow.objects.filter(pk=workflow_id).first()
            if workflow is None:
                continue
            counts = step_counts(workflow_id)
            live: dict[str, Any] = {"counts": counts}
            if sum(counts.values()) <= max_boxes():
                if not steps:
                    continue
                ids = steps + dependents_in_workflow(workflow_id, steps)
                live["boxes"] = step_boxes(workflow_id, list(dict.fromkeys(ids)))
            elif now - self.workflow_rendered_at.get(workflow_id, 0.0) >= every:
                live["graph"] = workflow_graph(workflow_id)
                live.pop("counts")
                self.workflow_rendered_at[workflow_id] = now
                self.workflows_pending.discard(workflow_id)
            else:
                self.workflows_pending.add(workflow_id)
                if not steps:
                    continue
            html = {
                role: render.workflow_live(workflow, role, **live) for role in watched[workflow_id]
            }
            yield (
                workflow_group(workflow_id),
                {
                    "type": "workflow.update",
                    "workflow": str(workflow_id),
                    "html": html,
                },
            )

    def _page_pushes(self, subs: dict[str, Subscription]):
        now = time.monotonic()
        quiet_after = float(setting("SUMMARY_REFRESH_SECONDS"))
        at_least = float(setting("WORKERS_REFRESH_SECONDS"))
        wanted: dict[str, set[str]] = {}
        for sub in subs.values():
            if sub.page in SUMMARY_PAGES:
                wanted.setdefault(sub.page, set()).add(sub.role)
        pushed = False
        for page, roles in wanted.items():
            since = now - self.rendered_at.get(page, 0.0)
            if not ((self.dirty and since >= quiet_after) or since >= at_least):
                continue
            context = render.PAGE_CONTEXTS[page]()
            html = {role: render.page_live(page, role, context) for role in roles}
            self.rendered_at[page] = now
            pushed = True
            yield page_group(page), {"type": "page.refresh", "page": page, "html": html}
        if pushed or not wanted:
            self.dirty = False


def _starting_points(new_jobs: NewJobCursor) -> int:
    """Where the event table ends (returned) and, primed, which jobs exist already."""
    new_jobs.prime()
    return max_event_id()


def _summaries(ids: list[uuid.UUID], *, with_payload: bool) -> list[dict[str, Any]]:
    """New jobs described just enough for each list page to test its own filter."""
    columns = [
        "id",
        "status",
        "queue",
        "operation",
        "parent_id",
        "schedule_id",
        "workflow_id",
        "created_at",
        "error_code",
        "error_message",
    ]
    if with_payload:
        columns.append("payload")
    out = []
    for row in Job.objects.filter(pk__in=ids).values(*columns):
        row["id"] = str(row["id"])
        row["parent_id"] = str(row["parent_id"]) if row["parent_id"] else None
        row["schedule_id"] = str(row["schedule_id"]) if row["schedule_id"] else None
        row["workflow_id"] = str(row["workflow_id"]) if row["workflow_id"] else None
        row["created_at"] = row["created_at"].isoformat()
        out.append(row)
    return out


relay = Relay()
