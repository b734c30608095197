"""The dashboard's WebSocket: one socket per open page, subscribed to what the page shows.

The client sends one message, ``{"subscribe": {...}}``, naming its page
(``job`` with the job id and the last seq it shows; ``jobs`` with the ids of
its rows, its filter and its newest row's time; ``overview``, ``workers``,
``queues``). The consumer checks the user's role at connect (no role: the
socket is refused), sends what the page missed since it was drawn, then
forwards the relay's pushes as ``{"html": ...}`` fragments that swap in by id.
"""

from __future__ import annotations

import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import QueryDict

from dashboard import detail as detail_reads
from dashboard import render, selectors
from dashboard.relay import (
    LIST_GROUP,
    SUMMARY_PAGES,
    Subscription,
    job_group,
    page_group,
    relay,
    workflow_group,
)
from dashboard.workflow_graph import workflow_graph
from jobs.models import Job, Workflow
from jobs.permissions import role_of
from jobs.selectors import JobFilters, parse_timestamp, parse_uuid, read_job_filters
from jobs.selectors.counts import capped_count
from jobs.selectors.timeouts import bounded_reads

MAX_IDS = 500
MAX_SEQ = 2**31 - 1  # the seq column is a 32-bit integer on every database


def _seq(value: Any) -> int | None:
    """A seq sent by a client (``after``): 0 when absent, None when it is not a whole number."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return min(MAX_SEQ, max(0, int(value)))
    except (ValueError, OverflowError):  # "abc", NaN, Infinity
        return None


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    role: str | None = None
    sub: Subscription | None = None
    group: str | None = None
    cursor: int = 0
    newest = None
    new_ids: set[str]
    new_base: int = 0  # new jobs counted at subscribe time

    async def connect(self) -> None:
        self.role = await database_sync_to_async(role_of)(self.scope.get("user"))
        if self.role is None:
            await self.close(code=4403)
            return
        self.new_ids = set()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        spec = content.get("subscribe") if isinstance(content, dict) else None
        if not isinstance(spec, dict):
            await self.send_json({"error": 'Send {"subscribe": {"page": ...}}.'})
            return
        sub = self._parse(spec)
        if sub is None:
            await self.send_json({"error": "Unknown page or job id."})
            return
        await self._leave()
        self.sub = sub
        self.group = (
            job_group(sub.job_id)
            if sub.job_id is not None  # only a job page names a job (``_parse``)
            else workflow_group(sub.workflow_id)
            if sub.workflow_id is not None
            else LIST_GROUP
            if sub.page == "jobs"
            else page_group(sub.page)
        )
        await self.channel_layer.group_add(self.group, self.channel_name)
        await relay.add(self.channel_name, sub)
        if sub.page == "job":
            await self._catch_up()
        elif sub.page == "jobs":
            await self._catch_up_list(spec.get("rendered_at"))
        elif sub.page == "workflow":
            await self._catch_up_workflow()
        await self.send_json({"subscribed": sub.page})

    def _parse(self, spec: dict[str, Any]) -> Subscription | None:
        page = spec.get("page")
        assert self.role is not None
        if page == "job":
            job_id = parse_uuid(spec.get("job"))
            after = _seq(spec.get("after"))
            if job_id is None or after is None:
                return None
            self.cursor = after
            return Subscription(page="job", role=self.role, job_id=job_id, after=after)
        if page == "jobs":
            ids = spec.get("ids") or []
            if not isinstance(ids, list):
                return None
            query = spec.get("query")
            filters = read_job_filters(QueryDict(query if isinstance(query, str) else ""))
            self.newest = parse_timestamp(spec.get("newest")) if spec.get("first_page") else None
            self.new_ids = set()
            self.new_base = 0
            job_ids = (parse_uuid(i) for i in ids[:MAX_IDS])
            return Subscription(
                page="jobs",
                role=self.role,
                ids={str(i) for i in job_ids if i is not None},
                filters=filters,
            )
        if page == "workflow":
            workflow_id = parse_uuid(spec.get("workflow"))
            if workflow_id is None:
                return None
            return Subscription(page="workflow", role=self.role, workflow_id=workflow_id)
        if page in SUMMARY_PAGES:
            return Subscription(page=page, role=self.role)
        return None

    async def _leave(self) -> None:
        relay.remove(self.channel_name)
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None

    # --- catching up ------------------------------------------------------------
    async def _catch_up(self) -> None:
        """Send what happened to the job between the page's render and this subscription."""
        assert self.sub and self.sub.job_id
        html, last = await database_sync_to_async(_job_since)(
            self.sub.job_id, self.role, self.cursor
        )
        self.cursor = max(self.cursor, last)
        if html:
            await self.send_json({"html": html})

    async def _catch_up_workflow(self) -> None:
        """The whole graph once: whatever changed between the page's render and now."""
        assert self.sub and self.sub.workflow_id
        html = await database_sync_to_async(_workflow_now)(self.sub.workflow_id, self.role)
        if html:
            await self.send_json({"html": html})

    async def _catch_up_list(self, rendered_at: Any) -> None:
        """Rows that changed, and new jobs that arrived, since the list was drawn."""
        assert self.sub is not None
        since = parse_timestamp(rendered_at)
        if since is None:
            return
        html, self.new_base = await database_sync_to_async(_list_since)(
            self.sub, self.role, since, self.newest
        )
        if html:
            await self.send_json({"html": html})

    # --- pushes from the relay ------------------------------------------------------
    async def job_update(self, message: dict[str, Any]) -> None:
        if not self.sub or str(self.sub.job_id) != message["job"]:
            return
        entries = [(seq, html) for seq, html in message["entries"] if seq > self.cursor]
        if entries and entries[0][0] > self.cursor + 1:
            # The relay started this job later than this page: fill the gap ourselves.
            missing = await database_sync_to_async(_entries_between)(
                self.sub.job_id, self.cursor, entries[0][0]
            )
            entries = missing + entries
        if entries:
            self.cursor = entries[-1][0]
        head = message["head"].get(self.role, "")
        await self.send_json({"html": head + str(render.timeline_append(entries))})

    async def jobs_changed(self, message: dict[str, Any]) -> None:
        if not self.sub or self.sub.page != "jobs":
            return
        parts = [
            versions[self.role]
            for job_id, versions in message["rows"].items()
            if job_id in self.sub.ids and self.role in versions
        ]
        if self.newest is not None and (message["new"] or message["many"]):
            filters = self.sub.filters or JobFilters()
            for job in message["new"]:
                created = parse_timestamp(job["created_at"])
                if (
                    created
                    and created > self.newest
                    and filters.matches({**job, "created_at": created})
                ):
                    self.new_ids.add(job["id"])
            if self.new_ids or message["many"]:
                count = self.new_base + len(self.new_ids)
                parts.append(
                    render.new_jobs_banner(
                        count or 1, filters.querystring(), many=bool(message["many"] and not count)
                    )
                )
        if parts:
            await self.send_json({"html": "".join(parts)})

    async def workflow_update(self, message: dict[str, Any]) -> None:
        if not self.sub or str(self.sub.workflow_id) != message["workflow"]:
            return
        html = message["html"].get(self.role)
        if html:
            await self.send_json({"html": html})

    async def page_refresh(self, message: dict[str, Any]) -> None:
        html = message["html"].get(self.role)
        if html and self.sub and self.sub.page == message["page"]:
            await self.send_json({"html": html})


# The catch-up reads below run in the database thread under the pages' own
# statement timeout (``bounded_reads``): a socket must not hold the database
# longer than a page view may. A timeout raises, which closes that socket;
# the page then falls back to polling.


def _job_since(job_id: uuid.UUID, role: str, after: int) -> tuple[str, int]:
    with bounded_reads():
        return _job_since_bounded(job_id, role, after)


def _job_since_bounded(job_id: uuid.UUID, role: str, after: int) -> tuple[str, int]:
    detail = detail_reads.job_detail(job_id)
    if detail is None:
        return "", after
    events = detail_reads.events_after(job_id, after)
    if not events:  # every change writes an event: none means the page is current
        return "", after
    return str(render.job_live(detail, role, events)), events[-1].seq


def _workflow_now(workflow_id: uuid.UUID, role: str | None) -> str:
    with bounded_reads():
        workflow = Workflow.objects.filter(pk=workflow_id).first()
        if workflow is None:
            return ""
        return render.workflow_live(workflow, role, graph=workflow_graph(workflow_id))


def _entries_between(job_id: uuid.UUID, after: int, before: int) -> list[tuple[int, str]]:
    with bounded_reads():
        events = [e for e in detail_reads.events_after(job_id, after) if e.seq < before]
    return [(seq, str(html)) for seq, html in render.timeline_entries(events)]


def _list_since(sub: Subscription, role: str, since, newest) -> tuple[str, int]:
    with bounded_reads():
        return _list_since_bounded(sub, role, since, newest)


def _list_since_bounded(sub: Subscription, role: str, since, newest) -> tuple[str, int]:
    changed = Job.objects.filter(pk__in=list(sub.ids), last_event_at__gt=since).values_list(
        "pk", flat=True
    )
    html = str(render.rows_oob(selectors.job_rows(changed), role)) if sub.ids else ""
    fresh = 0
    if newest is not None and sub.filters is not None:
        count = capped_count(
            sub.filters.apply(Job.objects.filter(created_at__gt=newest)), limit=999
        )
        fresh = int(count)
        if fresh:
            html += render.new_jobs_banner(fresh, sub.filters.querystring(), many=count.capped)
    return html, fresh
