"""Job filters: the ``JobFilters`` value and reading one from a query string or a JSON body.

Shared by the job list, counts and bulk actions (API and dashboard alike), so
every caller accepts the same spellings and refuses the same mistakes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.models import Job
from jobs.states import Status
from jobs.storable import unstorable_text

STATES: tuple[str, ...] = tuple(s.value for s in Status)
# The keys ``job_filters_from_query`` reads.
FILTER_KEYS: tuple[str, ...] = (
    "status",
    "queue",
    "operation",
    "parent",
    "created_after",
    "created_before",
    "q",
    "schedule",
)

_HEXISH = re.compile(r"^[0-9a-fA-F-]{4,36}$")
# The dashboard's short id: head and tail of the UUID (``0193a1b2…c09f3c``).
_SHORT_ID = re.compile(r"^([0-9a-fA-F]{8})(?:…|\.\.\.)([0-9a-fA-F]{4,12})$")


class InvalidFilter(ValueError):
    """A filter, cursor or limit could not be read; ``errors`` maps fields to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("The filters are invalid: fix the fields named in 'errors'.")


@dataclass(frozen=True)
class JobFilters:
    """What a job list, a count or a bulk action is restricted to.

    Each tuple is an OR over its values; the fields AND together.
    ``top_level`` keeps only jobs without a parent (``parent=none``).
    """

    status: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()
    operation: tuple[str, ...] = ()
    parent: uuid.UUID | None = None
    top_level: bool = False
    created_after: datetime | None = None
    created_before: datetime | None = None
    q: str = ""
    ids: tuple[uuid.UUID, ...] = ()
    schedule: uuid.UUID | None = None

    @property
    def is_empty(self) -> bool:
        """True when nothing restricts the jobs: a bulk action needs ``all`` then."""
        return self == JobFilters()

    def apply(self, queryset: QuerySet[Job]) -> QuerySet[Job]:
        qs = queryset
        if self.status:
            qs = qs.filter(status__in=self.status)
        if self.queue:
            qs = qs.filter(queue__in=self.queue)
        if self.operation:
            qs = qs.filter(operation__in=self.operation)
        if self.parent is not None:
            qs = qs.filter(parent_id=self.parent)
        if self.top_level:
            qs = qs.filter(parent__isnull=True)
        if self.created_after is not None:
            qs = qs.filter(created_at__gte=self.created_after)
        if self.created_before is not None:
            qs = qs.filter(created_at__lt=self.created_before)
        if self.ids:
            qs = qs.filter(pk__in=self.ids)
        if self.schedule is not None:
            qs = qs.filter(schedule_id=self.schedule)
        if self.q:
            qs = qs.filter(text_query(self.q))
        return qs


def text_query(text: str) -> Q:
    """Free text over id (whole, prefix, or the short form head…tail), operation and errors."""
    try:
        return Q(pk=uuid.UUID(text))
    except ValueError:
        pass
    short = _SHORT_ID.match(text)
    if short:
        return Q(id__istartswith=short.group(1)) & Q(id__iendswith=short.group(2))
    query = (
        Q(operation__icontains=text)
        | Q(error_code__icontains=text)
        | Q(error_message__icontains=text)
    )
    if _HEXISH.match(text):
        query |= Q(id__istartswith=text)
    return query


def _values(data: Mapping[str, Any], name: str) -> list[Any]:
    """Every value given for ``name``: repeated query keys, lists, or comma-separated text."""
    raw: list[Any]
    getlist = getattr(data, "getlist", None)
    if getlist is not None:
        raw = list(getlist(name))
    else:
        value = data.get(name)
        raw = [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
    out: list[Any] = []
    for item in raw:
        if isinstance(item, str):
            out.extend(part.strip() for part in item.split(",") if part.strip())
        else:
            out.append(item)
    return out


def _single(data: Mapping[str, Any], name: str) -> Any:
    """The one value of ``name`` (the last one of a repeated query key); None when blank."""
    value = data.get(name)
    return None if value is None or value == "" else value


def parse_uuid(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID, or None when it is not one (never raises)."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def parse_timestamp(value: Any) -> datetime | None:
    """An ISO 8601 timestamp in UTC (naive means UTC), or None when it is not one.

    A ``+`` of an offset that arrived unencoded in a query string reads as a
    space; it is put back. A time whose UTC equivalent falls outside years
    1 to 9999 (``0001-01-01T00:00+05:00``) is not one either: converting it
    for the database would overflow (a 500 on SQLite) instead of matching
    nothing.
    """
    if isinstance(value, datetime):
        parsed: datetime | None = value
    elif isinstance(value, str):
        text = value.strip()
        if "T" in text and " " in text:
            text = text.replace(" ", "+", 1)
        try:
            parsed = parse_datetime(text)
        except ValueError:
            return None
    else:
        return None
    if parsed is None:
        return None
    if timezone.is_naive(parsed):
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


def job_filters_from_query(data: Mapping[str, Any], *, allow_ids: bool = False) -> JobFilters:
    """Read ``JobFilters`` from a query string (a QueryDict) or a JSON object.

    ``status``, ``queue`` and ``operation`` take several values (repeated or
    comma-separated); ``parent`` takes a job id or ``none``; ``schedule`` a
    schedule id (the jobs it fired); ``created_after``
    and ``created_before`` take ISO 8601 timestamps; ``q`` is free text.
    Raises ``InvalidFilter`` naming each field it could not read.
    """
    errors: dict[str, list[str]] = {}
    raw_statuses = _values(data, "status")
    statuses = [s for s in raw_statuses if isinstance(s, str)]
    unknown = [s for s in statuses if s not in STATES]
    if len(statuses) != len(raw_statuses):
        errors["status"] = ["'status' must be a string or a list of strings."]
    elif unknown:
        # repr() escapes NUL and lone surrogates, so the message itself is storable text.
        named = ", ".join(repr(s[:40]) for s in unknown[:5])
        errors["status"] = [f"Unknown status {named}; use one of {', '.join(STATES)}."]
    texts: dict[str, tuple[str, ...]] = {}
    for name in ("queue", "operation"):
        values = _values(data, name)
        if any(not isinstance(v, str) for v in values):
            errors[name] = [f"'{name}' must be a string or a list of strings."]
        elif unstorable_text(values):
            errors[name] = [str(unstorable_text(values))]
        texts[name] = tuple(str(v) for v in values)
    parent: uuid.UUID | None = None
    top_level = False
    raw_parent = _single(data, "parent")
    if raw_parent is not None:
        if isinstance(raw_parent, str) and raw_parent.lower() in {"none", "null"}:
            top_level = True
        else:
            parent = parse_uuid(raw_parent)
            if parent is None:
                errors["parent"] = ["'parent' must be a job id (a UUID) or 'none'."]
    schedule = None
    raw_schedule = _single(data, "schedule")
    if raw_schedule is not None:
        schedule = parse_uuid(raw_schedule)
        if schedule is None:
            errors["schedule"] = ["'schedule' must be a schedule id (a UUID)."]
    stamps: dict[str, datetime | None] = {}
    for name in ("created_after", "created_before"):
        raw = _single(data, name)
        stamps[name] = parse_timestamp(raw) if raw is not None else None
        if raw is not None and stamps[name] is None:
            errors[name] = [
                f"'{name}' must be an ISO 8601 timestamp between years 1 and 9999 (UTC)."
            ]
    q = _single(data, "q")
    if q is not None and not isinstance(q, str):
        errors["q"] = ["'q' must be a string."]
        q = None
    elif q is not None and unstorable_text(q):
        errors["q"] = [str(unstorable_text(q))]
        q = None
    ids: list[uuid.UUID] = []
    if allow_ids:
        raw_ids = data.get("ids")
        if raw_ids is not None:
            if not isinstance(raw_ids, (list, tuple)):
                errors["ids"] = ["'ids' must be a list of job ids."]
            else:
                ids = [i for i in (parse_uuid(v) for v in raw_ids) if i is not None]
                if len(ids) != len(raw_ids):
                    errors["ids"] = ["Every entry of 'ids' must be a job id (a UUID)."]
                elif not ids:
                    errors["ids"] = ["'ids' is empty: name at least one job."]
    if errors:
        raise InvalidFilter(errors)
    return JobFilters(
        status=tuple(dict.fromkeys(statuses)),
        queue=texts["queue"],
        operation=texts["operation"],
        parent=parent,
        top_level=top_level,
        created_after=stamps["created_after"],
        created_before=stamps["created_before"],
        q=(q or "").strip(),
        ids=tuple(dict.fromkeys(ids)),
        schedule=schedule,
    )


def parse_limit(raw: Any, *, default: int, maximum: int, name: str = "limit") -> int:
    """A page size from a query value: 1..``maximum``, ``default`` when absent."""
    if raw in (None, ""):
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidFilter({name: [f"'{name}' must be a whole number."]}) from None
    if not 1 <= value <= maximum:
        raise InvalidFilter({name: [f"'{name}' must be from 1 to {maximum}."]})
    return value
