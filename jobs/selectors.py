"""Reads for the REST API and the dashboard.

Plain keyword-friendly functions over the ORM, named ``<entity>_<what>``;
views and templates call these and never build job querysets themselves, so
every page and endpoint reads the same way and stays on an index:

- ``job_list(filters, cursor, limit)``: newest first, keyset-paginated on
  ``(created_at, id)`` (the ``job_created_idx`` index), so page 10,000 costs
  what page 1 costs.
- ``estimated_count(queryset, cap)``: counts at most ``cap`` rows, never the
  whole table.
- ``job_events_after(job_id, after, limit)``: the timeline cursor over the
  per-job ``seq`` (the unique ``(job, seq)`` index).
- ``queue_stats()`` / ``queue_detail(name)`` and ``worker_list()`` /
  ``worker_detail(id)``: the operator overviews.

Filters come in as a ``JobFilters`` value; ``job_filters_from_query`` builds
one from a query string or a JSON body and names the fields it refuses.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.conf import knob
from jobs.models import BatchMessage, Job, JobEvent, Queue, Worker
from jobs.states import RUNNING, TERMINAL, Status

STATES: tuple[str, ...] = tuple(s.value for s in Status)
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
DEFAULT_EVENT_LIMIT = 500
MAX_EVENT_LIMIT = 1000
# A capped count that has not finished in this time is reported as unknown
# (PostgreSQL only): a rare free-text match must not hold a page for seconds.
COUNT_TIMEOUT_MS = 1000

_HEXISH = re.compile(r"^[0-9a-fA-F-]{4,36}$")
# PostgreSQL text and jsonb cannot hold NUL; such input is refused, not sent.
NUL_MESSAGE = "Null characters are not allowed."


def contains_nul(value: Any) -> bool:
    """True if any string (or object key) inside a JSON value holds a NUL character."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(contains_nul(k) or contains_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(contains_nul(v) for v in value)
    return False


class InvalidFilter(ValueError):
    """A filter, cursor or limit could not be read; ``errors`` maps fields to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("The filters are invalid: fix the fields named in 'errors'.")


# --- filters -----------------------------------------------------------------

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
        if self.q:
            qs = qs.filter(_text_query(self.q))
        return qs


def _text_query(text: str) -> Q:
    """Free text over id (whole or prefix), operation, error code and error message."""
    try:
        return Q(pk=uuid.UUID(text))
    except ValueError:
        pass
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
    """An ISO 8601 timestamp (naive means UTC), or None when it is not one.

    A ``+`` of an offset that arrived unencoded in a query string reads as a
    space; it is put back.
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
    if parsed is not None and timezone.is_naive(parsed):
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def job_filters_from_query(data: Mapping[str, Any], *, allow_ids: bool = False) -> JobFilters:
    """Read ``JobFilters`` from a query string (a QueryDict) or a JSON object.

    ``status``, ``queue`` and ``operation`` take several values (repeated or
    comma-separated); ``parent`` takes a job id or ``none``; ``created_after``
    and ``created_before`` take ISO 8601 timestamps; ``q`` is free text.
    Raises ``InvalidFilter`` naming each field it could not read.
    """
    errors: dict[str, list[str]] = {}
    statuses = [str(s) for s in _values(data, "status")]
    unknown = [s for s in statuses if s not in STATES]
    if unknown:
        errors["status"] = [
            f"Unknown status {', '.join(map(repr, unknown))}; use one of {', '.join(STATES)}."
        ]
    texts: dict[str, tuple[str, ...]] = {}
    for name in ("queue", "operation"):
        values = _values(data, name)
        if any(not isinstance(v, str) for v in values):
            errors[name] = [f"'{name}' must be a string or a list of strings."]
        elif any("\x00" in v for v in values):
            errors[name] = [NUL_MESSAGE]
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
    stamps: dict[str, datetime | None] = {}
    for name in ("created_after", "created_before"):
        raw = _single(data, name)
        stamps[name] = parse_timestamp(raw) if raw is not None else None
        if raw is not None and stamps[name] is None:
            errors[name] = [f"'{name}' must be an ISO 8601 timestamp."]
    q = _single(data, "q")
    if q is not None and not isinstance(q, str):
        errors["q"] = ["'q' must be a string."]
        q = None
    elif q is not None and "\x00" in q:
        errors["q"] = [NUL_MESSAGE]
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


# --- job list ------------------------------------------------------------------

@dataclass(frozen=True)
class JobCursor:
    """Where a page of the newest-first job list ends: the last row's sort key."""

    created_at: datetime
    id: uuid.UUID

    def encode(self) -> str:
        raw = f"{self.created_at.isoformat()}|{self.id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> JobCursor:
        """Read a cursor made by ``encode``; ``InvalidFilter`` if it is not one."""
        try:
            padded = token + "=" * (-len(token) % 4)
            stamp, _, ident = base64.urlsafe_b64decode(padded.encode()).decode().partition("|")
            created_at = parse_timestamp(stamp)
            job_id = uuid.UUID(ident)
        except (ValueError, binascii.Error, UnicodeError):
            created_at = None
        if created_at is None:
            raise InvalidFilter({"cursor": ["The cursor is not valid; start again without it."]})
        return cls(created_at=created_at, id=job_id)


@dataclass(frozen=True)
class JobPage:
    results: list[Job]
    next_cursor: str | None


def job_queryset(filters: JobFilters | None = None) -> QuerySet[Job]:
    """Jobs matching ``filters``, newest first (ties broken by id, descending)."""
    qs = Job.objects.all()
    if filters is not None:
        qs = filters.apply(qs)
    return qs.order_by("-created_at", "-id")


def after_cursor(queryset: QuerySet[Job], cursor: JobCursor) -> QuerySet[Job]:
    """Rows strictly after ``cursor`` in newest-first order.

    The redundant ``created_at <= c`` is what lets PostgreSQL start the index
    scan at the cursor instead of filtering every newer row.
    """
    return queryset.filter(created_at__lte=cursor.created_at).filter(
        Q(created_at__lt=cursor.created_at) | Q(id__lt=cursor.id)
    )


def job_list(
    filters: JobFilters | None = None,
    cursor: JobCursor | str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
) -> JobPage:
    """One page of jobs, newest first, and the cursor of the next page (or None)."""
    if isinstance(cursor, str):
        cursor = JobCursor.decode(cursor) if cursor else None
    qs = job_queryset(filters)
    if cursor is not None:
        qs = after_cursor(qs, cursor)
    rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = JobCursor(rows[-1].created_at, rows[-1].id).encode() if more and rows else None
    return JobPage(results=rows, next_cursor=next_cursor)


def job_ids_batches(
    filters: JobFilters, *, statuses: Sequence[str] | None = None, batch_size: int = 500
) -> Iterable[list[uuid.UUID]]:
    """Ids matching ``filters`` (and ``statuses``), ``batch_size`` at a time, newest first.

    A keyset walk: the caller may change the jobs of one batch (cancel,
    retry) before asking for the next without skipping or repeating any.
    """
    qs = job_queryset(filters)
    if statuses is not None:
        qs = qs.filter(status__in=list(statuses))
    cursor: JobCursor | None = None
    while True:
        page = after_cursor(qs, cursor) if cursor else qs
        rows = list(page.values_list("created_at", "id")[:batch_size])
        if not rows:
            return
        yield [r[1] for r in rows]
        if len(rows) < batch_size:
            return
        cursor = JobCursor(rows[-1][0], rows[-1][1])


@dataclass(frozen=True)
class CountResult:
    """A count that stops at ``cap``: ``value`` is exact unless ``capped``.

    ``value`` is None when even the capped count ran out of time.
    ``estimate`` is the planner's guess of the full count (PostgreSQL, when capped).
    """

    value: int | None
    capped: bool
    estimate: int | None = None


def estimated_count(queryset: QuerySet[Any], cap: int | None = None) -> CountResult:
    """Count ``queryset`` up to ``cap`` rows (knob ``COUNT_CAP``), never the whole table.

    The count runs as ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``; on PostgreSQL
    it is also bounded in time, and past the cap the planner's row estimate is
    given as ``estimate``.
    """
    cap = int(knob("COUNT_CAP") if cap is None else cap)
    bounded = queryset.order_by()[: cap + 1]
    alias = queryset.db
    postgres = connections[alias].vendor == "postgresql"
    try:
        if postgres:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                # SET LOCAL outlives a released savepoint: put the old value back.
                cursor.execute("SHOW statement_timeout")
                previous = cursor.fetchone()[0]
                cursor.execute(f"SET LOCAL statement_timeout = {int(COUNT_TIMEOUT_MS)}")
                value = bounded.count()
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
        else:
            value = bounded.count()
    except DatabaseError:
        if not postgres:
            raise
        return CountResult(value=None, capped=True, estimate=_planner_estimate(queryset))
    if value > cap:
        estimate = _planner_estimate(queryset) if postgres else None
        return CountResult(value=cap, capped=True, estimate=estimate)
    return CountResult(value=value, capped=False)


def _planner_estimate(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's own row estimate for ``queryset`` (EXPLAIN, no execution)."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    try:
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
    except DatabaseError:
        return None
    if isinstance(plan, str):
        plan = json.loads(plan)
    try:
        return int(plan[0]["Plan"]["Plan Rows"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def job_count(filters: JobFilters | None = None, cap: int | None = None) -> CountResult:
    """How many jobs match ``filters``, counted up to ``cap`` (see ``estimated_count``)."""
    return estimated_count(job_queryset(filters), cap)


# --- one job -------------------------------------------------------------------

def job_get(job_id: uuid.UUID | str) -> Job | None:
    """The job, or None when ``job_id`` is not a UUID or names no job."""
    pk = parse_uuid(job_id) if not isinstance(job_id, uuid.UUID) else job_id
    if pk is None:
        return None
    return Job.objects.filter(pk=pk).first()


def job_children_counts(job_id: uuid.UUID) -> dict[str, int]:
    """Direct children of a job counted by state, every state present (zeros included)."""
    counts = dict.fromkeys(STATES, 0)
    children = Job.objects.filter(parent_id=job_id).order_by()
    rows = children.values_list("status").annotate(n=Count("id"))
    for status, n in rows:
        counts[status] = n
    return counts


def job_events_after(
    job_id: uuid.UUID, after: int = 0, limit: int = DEFAULT_EVENT_LIMIT
) -> list[JobEvent]:
    """Events of a job with ``seq > after``, ascending, at most ``limit``.

    A poller that passes the largest seq it has seen never misses or repeats
    one: seqs are taken under the job's row lock, so they commit in order.
    """
    return list(
        JobEvent.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")[:limit]
    )


# --- queues --------------------------------------------------------------------

@dataclass
class QueueStats:
    name: str
    kind: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    oldest_queued_age: float | None = None
    paused: bool = False
    concurrency_cap: int | None = None
    finished_last_minute: int = 0
    finished_last_hour: int = 0
    pending_messages: int = 0

    @property
    def running(self) -> int:
        return self.counts.get(RUNNING, 0)

    @property
    def throughput(self) -> dict[str, int]:
        return {"last_minute": self.finished_last_minute, "last_hour": self.finished_last_hour}


def queue_stats(names: Sequence[str] | None = None) -> list[QueueStats]:
    """Every queue (Queue rows, queues named by jobs or batch messages), sorted by name.

    ``oldest_queued_age`` is the age in seconds of the oldest queued job (by
    ``created_at``); throughput counts jobs that finished in the last minute
    and hour. ``names`` restricts the result to those queues.
    """
    now = timezone.now()
    jobs = Job.objects.order_by()
    rows = Queue.objects.all()
    messages = BatchMessage.objects.order_by()
    if names is not None:
        jobs, rows, messages = (
            jobs.filter(queue__in=names),
            rows.filter(name__in=names),
            messages.filter(queue__in=names),
        )
    stats: dict[str, QueueStats] = {}

    def get(name: str) -> QueueStats:
        if name not in stats:
            stats[name] = QueueStats(name=name, kind=Queue.default_kind(name))
        return stats[name]

    for row in rows:
        entry = get(row.name)
        entry.kind, entry.paused, entry.concurrency_cap = row.kind, row.paused, row.concurrency_cap
    for queue, status, n in jobs.values_list("queue", "status").annotate(n=Count("id")):
        get(queue).counts[status] = n
    queued = jobs.filter(status=Status.QUEUED)
    oldest = queued.values_list("queue").annotate(oldest=Min("created_at"))
    for queue, first in oldest:
        get(queue).oldest_queued_age = round(max((now - first).total_seconds(), 0.0), 3)
    hour = jobs.filter(status__in=list(TERMINAL), finished_at__gte=now - timedelta(hours=1))
    minute_ago = now - timedelta(minutes=1)
    for queue, last_hour, last_minute in hour.values_list("queue").annotate(
        h=Count("id"), m=Count("id", filter=Q(finished_at__gte=minute_ago))
    ):
        entry = get(queue)
        entry.finished_last_hour, entry.finished_last_minute = last_hour, last_minute
    for queue, n in messages.values_list("queue").annotate(n=Count("id")):
        get(queue).pending_messages = n
    if names is not None:
        for name in names:
            get(name)
    return [stats[name] for name in sorted(stats)]


def queue_detail(name: str) -> QueueStats:
    """One queue's figures; a queue nobody has used yet reads as empty."""
    return queue_stats([name])[0]


# --- workers -------------------------------------------------------------------

@dataclass
class WorkerInfo:
    worker: Worker
    current_jobs: list[uuid.UUID]
    heartbeat_age: float

    def __getattr__(self, name: str) -> Any:
        # Serializers read worker columns straight off this object.
        return getattr(self.__dict__["worker"], name)


def _worker_infos(workers: Sequence[Worker]) -> list[WorkerInfo]:
    now = timezone.now()
    running: dict[uuid.UUID, list[uuid.UUID]] = {w.pk: [] for w in workers}
    if workers:
        held = (
            Job.objects.filter(status=RUNNING, worker_id__in=list(running))
            .order_by("started_at", "id")
            .values_list("worker_id", "id")
        )
        for worker_id, job_id in held:
            running[worker_id].append(job_id)
    return [
        WorkerInfo(
            worker=w,
            current_jobs=running[w.pk],
            heartbeat_age=round(max((now - w.last_heartbeat).total_seconds(), 0.0), 3),
        )
        for w in workers
    ]


def worker_list() -> list[WorkerInfo]:
    """Every registered worker, oldest first, with the ids of the jobs it is running."""
    return _worker_infos(list(Worker.objects.order_by("started_at", "id")))


def worker_detail(worker_id: uuid.UUID | str) -> WorkerInfo | None:
    """One worker with its running jobs, or None when there is no such worker."""
    pk = parse_uuid(worker_id) if not isinstance(worker_id, uuid.UUID) else worker_id
    worker = Worker.objects.filter(pk=pk).first() if pk else None
    return _worker_infos([worker])[0] if worker else None
