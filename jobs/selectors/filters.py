"""Job filters: the one ``JobFilters`` value every face reads jobs with.

The REST API (``GET /jobs``, ``POST /jobs/cancel|retry``), the ``jobs``
command, the admin's bulk actions and the dashboard (its list, counts, bulk
actions and live updates) all select jobs with this type, read from a query
string or a JSON body by ``jobs.selectors.filter_query``. ``apply`` narrows a
queryset; ``matches`` answers the same question for one job summary, which
lets the live relay tell a list page about new jobs without a query per open
page; ``params``/``querystring`` write the filter back as a shareable URL
that reads back to the same filter.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db import connections
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from jobs import waiting
from jobs.selectors.payload import json_contains
from jobs.selectors.values import parse_timestamp
from jobs.states import Status

STATES: tuple[str, ...] = tuple(s.value for s in Status)
# "Created in the last …": a window ending now.
RANGES: dict[str, timedelta] = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}

_HEXISH = re.compile(r"^[0-9a-fA-F-]{4,36}$")
_HEX_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")
# The dashboard's short id: head and tail of the UUID (``0193a1b2…c09f3c``).
_SHORT_ID = re.compile(r"^([0-9a-fA-F]{8})(?:…|\.\.\.)([0-9a-fA-F]{4,12})$")


@dataclass(frozen=True)
class JobFilters:
    """What a job list, a count or a bulk action is restricted to.

    Each tuple is an OR over its values; the fields AND together.
    ``top_level`` keeps only jobs without a parent (``parent=none``); ``when``
    keeps queued jobs waiting for later (``jobs.waiting``: scheduled or
    retrying); ``range`` is a window ending now (``RANGES``); ``payload`` is
    a JSON object the payload must contain. ``errors`` (a sentence per field
    that could not be read, and was not applied), ``raw`` (what was typed,
    printable, for echoing into a form) and ``payload_text`` do not take part
    in equality: two readings that select the same jobs are equal.
    """

    status: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()
    operation: tuple[str, ...] = ()
    parent: uuid.UUID | None = None
    top_level: bool = False
    created_after: datetime | None = None
    created_before: datetime | None = None
    range: str = ""
    when: str = ""
    q: str = ""
    payload: dict[str, Any] | None = None
    ids: tuple[uuid.UUID, ...] = ()
    schedule: uuid.UUID | None = None
    # A workflow's steps (``job_workflow_idx``).
    workflow: uuid.UUID | None = None
    errors: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    raw: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    payload_text: str = field(default="", compare=False, repr=False)

    @property
    def is_empty(self) -> bool:
        """True when nothing restricts the jobs: a bulk action needs ``all`` then."""
        return self == JobFilters()

    @property
    def active(self) -> bool:
        return not self.is_empty

    # --- the URL -----------------------------------------------------------------

    def params(self) -> list[tuple[str, str]]:
        """The filter as query pairs (what a shared link carries); ``ids`` are not included."""
        out: list[tuple[str, str]] = [("status", s) for s in self.status]
        if self.when:
            out.append(("when", self.when))
        out += [("queue", v) for v in self.queue]
        out += [("operation", v) for v in self.operation]
        if self.top_level:
            out.append(("parent", "none"))
        elif self.parent is not None:
            out.append(("parent", str(self.parent)))
        if self.schedule is not None:
            out.append(("schedule", str(self.schedule)))
        if self.workflow is not None:
            out.append(("workflow", str(self.workflow)))
        if self.range:
            out.append(("range", self.range))
        if self.created_after is not None:
            out.append(("from", self._stamp_text(self.created_after, "from", "created_after")))
        if self.created_before is not None:
            out.append(("to", self._stamp_text(self.created_before, "to", "created_before")))
        if self.q:
            out.append(("q", self.q))
        if self.payload is not None:
            out.append(("payload", self.payload_text or json.dumps(self.payload)))
        return out

    def _stamp_text(self, value: datetime, *names: str) -> str:
        """A bound as it was typed (a ``datetime-local`` stays one), else in ISO 8601."""
        for name in names:
            text = self.raw.get(name, "")
            if text and parse_timestamp(text) == value:
                return text.strip()
        return value.isoformat()

    def querystring(self) -> str:
        return urlencode(self.params())

    def describe(self) -> dict[str, Any]:
        """The filter as an audit row stores it: only the fields that were given, as JSON."""
        out: dict[str, Any] = {}
        for name in ("status", "queue", "operation"):
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        if self.parent or self.top_level:
            out["parent"] = str(self.parent) if self.parent else "none"
        for name in ("created_after", "created_before"):
            if getattr(self, name):
                out[name] = getattr(self, name).isoformat()
        for name in ("range", "when", "q"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.schedule is not None:
            out["schedule"] = str(self.schedule)
        if self.workflow is not None:
            out["workflow"] = str(self.workflow)
        if self.payload is not None:
            out["payload"] = self.payload
        if self.ids:
            out["ids"] = [str(i) for i in self.ids]
        return out

    # --- applying ----------------------------------------------------------------

    def since(self, now: datetime | None = None) -> datetime | None:
        """The lower time bound: the later of the range preset and ``created_after``."""
        bounds = [b for b in (self.created_after,) if b]
        if self.range:
            bounds.append((now or timezone.now()) - RANGES[self.range])
        return max(bounds) if bounds else None

    def apply(self, queryset: QuerySet[Any], *, now: datetime | None = None) -> QuerySet[Any]:
        """``queryset`` (of jobs) narrowed to what these filters select."""
        qs = queryset
        if self.status:
            qs = qs.filter(status__in=self.status)
        if self.when:
            qs = qs.filter(waiting.condition(self.when, now))
        if self.queue:
            qs = qs.filter(queue__in=self.queue)
        if self.operation:
            qs = qs.filter(operation__in=self.operation)
        if self.parent is not None:
            qs = qs.filter(parent_id=self.parent)
        if self.top_level:
            qs = qs.filter(parent__isnull=True)
        since = self.since(now)
        if since is not None:
            qs = qs.filter(created_at__gte=since)
        if self.created_before is not None:
            qs = qs.filter(created_at__lt=self.created_before)
        if self.ids:
            qs = qs.filter(pk__in=self.ids)
        if self.schedule is not None:
            qs = qs.filter(schedule_id=self.schedule)
        if self.workflow is not None:
            qs = qs.filter(workflow_id=self.workflow)
        if self.q:
            qs = qs.filter(text_query(self.q))
        if self.payload is not None:
            qs = self._apply_payload(qs)
        return qs

    def _apply_payload(self, qs: QuerySet[Any]) -> QuerySet[Any]:
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
        ``schedule_id``, ``workflow_id``, ``created_at``, ``payload``, ``error_*``) passes these
        filters."""
        if self.status and job["status"] not in self.status:
            return False
        if self.when and not self._matches_when(job, now):
            return False
        if self.queue and job["queue"] not in self.queue:
            return False
        if self.operation and job["operation"] not in self.operation:
            return False
        parent = str(job.get("parent_id") or "")
        if self.parent is not None and parent != str(self.parent):
            return False
        if self.top_level and parent:
            return False
        if self.ids and str(job["id"]) not in {str(i) for i in self.ids}:
            return False
        if self.schedule is not None and str(job.get("schedule_id") or "") != str(self.schedule):
            return False
        if self.workflow is not None and str(job.get("workflow_id") or "") != str(self.workflow):
            return False
        since = self.since(now)
        if since and job["created_at"] < since:
            return False
        if self.created_before and job["created_at"] >= self.created_before:
            return False
        if self.q and not _text_matches(self.q, job):
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


def id_prefix_range(text: str) -> Q | None:
    """Ids starting with ``text`` (hex, dashes ignored) as a range the primary key serves.

    UUIDs order as their hex text on both databases (PostgreSQL compares the
    bytes, SQLite stores lowercase hex), so a prefix is the range from the
    prefix padded with 0s to it padded with fs, not ``id::text LIKE 'x%'``,
    which reads every row.
    """
    hexits = text.replace("-", "").lower()
    if not _HEX_PREFIX.match(hexits):
        return None
    return Q(pk__gte=uuid.UUID(hexits.ljust(32, "0")), pk__lte=uuid.UUID(hexits.ljust(32, "f")))


def text_query(text: str) -> Q:
    """Free text: an id (whole, a prefix, or the short form head…tail), a queue's exact
    name, or part of an operation's name or of an error."""
    try:
        return Q(pk=uuid.UUID(text))
    except ValueError:
        pass
    short = _SHORT_ID.match(text)
    if short:
        head = id_prefix_range(short.group(1))
        assert head is not None  # eight hex digits
        return head & Q(id__iendswith=short.group(2))
    query = (
        Q(queue=text)
        | Q(operation__icontains=text)
        | Q(error_code__icontains=text)
        | Q(error_message__icontains=text)
    )
    if _HEXISH.match(text) and (prefix := id_prefix_range(text)) is not None:
        query |= prefix
    return query


def _text_matches(text: str, job: dict[str, Any]) -> bool:
    """``text_query`` for one job summary."""
    needle = text.lower()
    job_id = str(job["id"]).lower()
    short = _SHORT_ID.match(text)
    if short:
        head, tail = short.group(1).lower(), short.group(2).lower()
        return job_id.replace("-", "").startswith(head) and job_id.endswith(tail)
    if needle == job_id or text == job.get("queue"):
        return True
    if _HEXISH.match(text) and job_id.replace("-", "").startswith(needle.replace("-", "")):
        return True
    haystack = " ".join(str(job.get(k) or "") for k in ("operation", "error_code", "error_message"))
    return needle in haystack.lower()
