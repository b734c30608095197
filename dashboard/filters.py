"""The job list's filters: parsed from the URL, applied to a queryset, matched in Python.

The URL is the single source of truth, so a filtered view can be shared by
copying its address. ``JobFilters.apply`` narrows a queryset; ``matches``
answers the same question for one job summary, which lets the live relay
tell a list page about new jobs without a query per open page.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db import connections
from django.db.models import QuerySet
from django.db.models.fields.json import KeyTransform
from django.http import QueryDict
from django.utils import timezone

from dashboard import waiting
from dashboard.inputs import InvalidJSON, parse_json_object, printable, text_problem
from jobs.selectors import parse_timestamp, text_query
from jobs.states import Status

RANGES: dict[str, timedelta] = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
FIELDS = (
    "status",
    "when",
    "queue",
    "operation",
    "parent",
    "schedule",
    "range",
    "from",
    "to",
    "q",
    "payload",
)
LABELS = {
    "status": "status",
    "when": "waiting",
    "queue": "queue",
    "operation": "operation",
    "parent": "parent job",
    "schedule": "schedule",
    "range": "created",
    "from": "from",
    "to": "to",
    "q": "search",
    "payload": "payload",
}


def json_contains(doc: Any, pattern: Any) -> bool:
    """PostgreSQL's ``jsonb @>`` in Python: objects by subset, arrays by membership."""
    if isinstance(pattern, dict):
        return isinstance(doc, dict) and all(
            k in doc and json_contains(doc[k], v) for k, v in pattern.items()
        )
    if isinstance(pattern, list):
        if not isinstance(doc, list):
            return False
        return all(any(json_contains(d, p) for d in doc) for p in pattern)
    if isinstance(pattern, bool) or isinstance(doc, bool):
        return type(doc) is type(pattern) and doc == pattern
    return doc == pattern


@dataclass(frozen=True)
class JobFilters:
    status: tuple[str, ...] = ()
    # "scheduled" or "retrying": queued jobs waiting for later (dashboard.waiting).
    when: str = ""
    queue: str = ""
    operation: str = ""
    parent: str = ""
    # The schedule that fired the jobs (job_schedule_idx serves it).
    schedule: str = ""
    range: str = ""
    time_from: datetime | None = None
    time_to: datetime | None = None
    q: str = ""
    payload_text: str = ""
    payload: dict[str, Any] | None = None
    errors: dict[str, str] = field(default_factory=dict, compare=False)
    raw: dict[str, str] = field(default_factory=dict, compare=False)

    # --- parsing -----------------------------------------------------------
    @classmethod
    def from_query(cls, query: QueryDict) -> JobFilters:
        """Read the filters from a query string; invalid values are reported, not applied.

        Never raises, whatever the text: each field it cannot read gets a
        sentence in ``errors`` (shown beside the field) and restricts nothing.
        Text no database can hold (a NUL, a lone surrogate) is caught here,
        before any query carries it (``dashboard.inputs``); what is kept in
        ``raw`` and ``payload_text`` for echoing back is always printable.
        """
        errors: dict[str, str] = {}
        raw: dict[str, str] = {}

        def text(name: str) -> str:
            value = query.get(name, "")
            if not isinstance(value, str):
                value = ""
            raw[name] = printable(value)
            if reason := text_problem(value):
                errors[name] = f"The {LABELS[name]} filter {reason}; it was not applied."
                return ""
            return value.strip()

        statuses: list[str] = []
        unknown: list[str] = []
        for value in query.getlist("status"):
            value = value.strip() if isinstance(value, str) else ""
            if value in Status.values:
                statuses.append(value)
            elif value:
                unknown.append(printable(value)[:40])
        if unknown:
            errors["status"] = (
                f"Unknown status {', '.join(map(repr, unknown))}; "
                f"use one of {', '.join(Status.values)}."
            )
        parent = text("parent")
        if parent:
            try:
                parent = str(uuid.UUID(parent))
            except ValueError:
                errors["parent"] = "The parent must be a job id."
                parent = ""
        schedule = text("schedule")
        if schedule:
            try:
                schedule = str(uuid.UUID(schedule))
            except ValueError:
                errors["schedule"] = "The schedule must be a schedule id."
                schedule = ""
        times: dict[str, datetime | None] = {}
        for name in ("from", "to"):
            value = text(name)
            times[name] = parse_timestamp(value) if value else None
            if value and times[name] is None:
                errors[name] = "Use a date and time such as 2025-01-31T14:00."
        payload_text = text("payload")
        payload = None
        if payload_text:
            try:
                payload = parse_json_object(payload_text)
            except InvalidJSON as error:
                errors["payload"] = str(error)
        elif "payload" in errors:
            payload_text = raw["payload"].strip()
        when = text("when")
        if when and when not in waiting.KINDS:
            errors["when"] = f"Choose {' or '.join(waiting.KINDS)} for the waiting jobs."
            when = ""
        range_ = text("range")
        if range_ and range_ not in RANGES:
            errors["range"] = f"Choose a range from the list: {', '.join(RANGES)}."
            range_ = ""
        return cls(
            status=tuple(dict.fromkeys(statuses)),
            when=when,
            queue=text("queue"),
            operation=text("operation"),
            parent=parent,
            schedule=schedule,
            range=range_,
            time_from=times["from"],
            time_to=times["to"],
            q=text("q")[:200].strip(),
            payload_text=payload_text,
            payload=payload,
            errors=errors,
            raw=raw,
        )

    # --- the URL -----------------------------------------------------------
    def params(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = [("status", s) for s in self.status]
        for key, value in (
            ("when", self.when),
            ("queue", self.queue),
            ("operation", self.operation),
            ("parent", self.parent),
            ("schedule", self.schedule),
            ("range", self.range),
            ("from", self.raw.get("from", "") if self.time_from else ""),
            ("to", self.raw.get("to", "") if self.time_to else ""),
            ("q", self.q),
            ("payload", self.payload_text if self.payload is not None else ""),
        ):
            if value:
                out.append((key, value))
        return out

    def querystring(self) -> str:
        return urlencode(self.params())

    @property
    def active(self) -> bool:
        return bool(self.params())

    @property
    def when_tabs(self) -> list[tuple[str, str, bool]]:
        """The list's view links ``(label, querystring, current)``: all jobs, scheduled, retrying.

        Each keeps the other filters; a waiting view drops ``status``, which it
        sets itself (queued).
        """
        tabs = [("All", replace(self, when="").querystring(), not self.when)]
        for kind in waiting.KINDS:
            query = replace(self, when=kind, status=()).querystring()
            tabs.append((kind.capitalize(), query, self.when == kind))
        return tabs

    def since(self, now: datetime | None = None) -> datetime | None:
        """The lower time bound: the later of the range preset and ``from``."""
        bounds = [b for b in (self.time_from,) if b]
        if self.range:
            bounds.append((now or timezone.now()) - RANGES[self.range])
        return max(bounds) if bounds else None

    # --- applying ------------------------------------------------------------
    def apply(self, qs: QuerySet, *, now: datetime | None = None) -> QuerySet:
        if self.status:
            qs = qs.filter(status__in=self.status)
        if self.when:
            qs = qs.filter(waiting.condition(self.when, now))
        if self.queue:
            qs = qs.filter(queue=self.queue)
        if self.operation:
            qs = qs.filter(operation=self.operation)
        if self.parent:
            qs = qs.filter(parent_id=self.parent)
        if self.schedule:
            qs = qs.filter(schedule_id=self.schedule)
        since = self.since(now)
        if since:
            qs = qs.filter(created_at__gte=since)
        if self.time_to:
            qs = qs.filter(created_at__lt=self.time_to)
        if self.q:
            qs = qs.filter(text_query(self.q))
        if self.payload is not None:
            qs = self._apply_payload(qs)
        return qs

    def _apply_payload(self, qs: QuerySet) -> QuerySet:
        """jsonb ``@>`` on PostgreSQL; on SQLite, one equality per top-level key.

        SQLite has no containment operator (Django refuses ``contains`` on its
        JSONField), so there a nested value must match exactly rather than by
        subset.
        """
        assert self.payload is not None
        if connections[qs.db].vendor == "postgresql":
            return qs.filter(payload__contains=self.payload)
        for index, (key, value) in enumerate(self.payload.items()):
            alias = f"_payload_key_{index}"
            qs = qs.alias(**{alias: KeyTransform(key, "payload")})
            qs = qs.filter(**{alias: value})  # None matches JSON null, as on PostgreSQL.
        return qs

    def matches(self, job: dict[str, Any], *, now: datetime | None = None) -> bool:
        """Whether a job summary (``id``, ``status``, ``queue``, ``operation``, ``parent_id``,
        ``schedule_id``, ``created_at``, ``payload``, ``error_*``) passes these filters."""
        if self.status and job["status"] not in self.status:
            return False
        if self.when and not self._matches_when(job, now):
            return False
        if self.queue and job["queue"] != self.queue:
            return False
        if self.operation and job["operation"] != self.operation:
            return False
        if self.parent and str(job.get("parent_id") or "") != self.parent:
            return False
        if self.schedule and str(job.get("schedule_id") or "") != self.schedule:
            return False
        since = self.since(now)
        if since and job["created_at"] < since:
            return False
        if self.time_to and job["created_at"] >= self.time_to:
            return False
        if self.q:
            text = self.q.lower()
            haystack = " ".join(
                str(job.get(k) or "") for k in ("operation", "error_code", "error_message")
            ).lower()
            if text not in haystack and text != str(job["id"]).lower():
                return False
        if self.payload is not None and not json_contains(job.get("payload"), self.payload):
            return False
        return True

    def _matches_when(self, job: dict[str, Any], now: datetime | None) -> bool:
        """A summary of a new job: it has not run yet, so it can only be scheduled.

        Without ``run_after`` in the summary a queued job is taken to match:
        the "new jobs" notice may then over-count, and the reload it offers
        shows the true rows.
        """
        if job["status"] != "queued" or self.when != waiting.SCHEDULED:
            return False
        run_after = job.get("run_after")
        if isinstance(run_after, str):
            run_after = parse_timestamp(run_after)
        return run_after is None or run_after > (now or timezone.now())
