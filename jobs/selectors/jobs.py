"""Job reads: the newest-first keyset list, one job, its children and its timeline."""

from __future__ import annotations

import base64
import binascii
import threading
import uuid
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, router
from django.db.models import Count, Model, Q, QuerySet, TextField
from django.db.models.expressions import Col, Expression, RawSQL
from django.db.models.functions import Cast

from jobs import timeline
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.models import Job, JobEvent
from jobs.selectors.counts import CountResult, estimated_count, recent_counts, table_estimate
from jobs.selectors.filters import STATES, JobFilters
from jobs.selectors.timeouts import bounded_fetchall, bounded_reads
from jobs.selectors.values import InvalidFilter, parse_timestamp, parse_uuid

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
DEFAULT_EVENT_LIMIT = 500
MAX_EVENT_LIMIT = 1000


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
    """A page of jobs: model instances, or (``documents``) each job's JSON as the database
    wrote it, when ``job_list`` was given a ``document`` expression on PostgreSQL."""

    results: list[Job]
    next_cursor: str | None
    documents: list[str] | None = None


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
    *,
    document: Expression | None = None,
    bounded: bool = False,
) -> JobPage:
    """One page of jobs, newest first, and the cursor of the next page (or None).

    ``document``: an expression over a job's row that gives its JSON as text
    (``django_controlplane.api.serializers.sql_document``). On PostgreSQL the page then comes
    back as those texts (``JobPage.documents``) and no model instance is made;
    elsewhere it is ignored. ``bounded``: read under the limits of
    ``bounded_reads`` (in one round trip, ``bounded_fetchall``, when it can).
    """
    if isinstance(cursor, str):
        cursor = JobCursor.decode(cursor) if cursor else None
    if document is not None:
        using = router.db_for_read(Job)  # where the queryset below would read
        if connections[using].vendor == "postgresql":
            statement = _page_statement(filters, cursor, limit, document, using)
            found: list[tuple[Any, ...]] = []
            if statement is not None and bounded:
                found = bounded_fetchall(using, *statement)
            elif statement is not None:
                with connections[using].cursor() as db:
                    db.execute(*statement)
                    found = db.fetchall()
            more = len(found) > limit
            found = found[:limit]
            last = None
            if more and found:  # the sort key comes as text: only the last row's is read
                created_at = parse_timestamp(found[-1][0])
                assert created_at is not None
                last = JobCursor(created_at, uuid.UUID(found[-1][1])).encode()
            return JobPage(results=[], next_cursor=last, documents=[row[2] for row in found])
    qs = job_queryset(filters)
    if cursor is not None:
        qs = after_cursor(qs, cursor)
    with bounded_reads(qs.db) if bounded else nullcontext():
        rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = JobCursor(rows[-1].created_at, rows[-1].id).encode() if more and rows else None
    return JobPage(results=rows, next_cursor=next_cursor)


def _page_statement(
    filters: JobFilters | None,
    cursor: JobCursor | None,
    limit: int,
    document: Expression,
    using: str,
) -> tuple[str, tuple[Any, ...]] | None:
    """The SQL of a documents page (``created_at``, ``id``, the JSON), compiled by the ORM
    from ``job_queryset`` exactly as ``job_list`` reads instances, and kept per page.

    A polled list asks for the same page (same filters, no cursor, same limit)
    many times a second; building and compiling its queryset costs the ORM
    0.4-0.8 ms of CPU each time for the same text and parameters. The last
    ``PAGE_STATEMENTS`` pages' statements are kept (a filter value that is not
    hashable, a payload filter, is compiled every time).
    """
    key: Hashable | None = (using, filters, cursor, limit, id(document))
    try:
        with _statements_lock:
            kept = _statements.get(key)
            if kept is not None and kept[0] is document:
                _statements.move_to_end(key)
                return kept[1], kept[2]
    except TypeError:  # unhashable filters
        key = None
    qs = job_queryset(filters)
    if cursor is not None:
        qs = after_cursor(qs, cursor)
    text = TextField()
    page = qs.values_list(Cast("created_at", text), Cast("id", text), _compiled(document, using))[
        : limit + 1
    ]
    try:
        sql, params = page.query.get_compiler(using).as_sql()
    except EmptyResultSet:  # filters nothing can match: no query at all, as the ORM does
        return None
    if key is not None:
        with _statements_lock:
            _statements[key] = (document, sql, tuple(params))
            while len(_statements) > PAGE_STATEMENTS:
                _statements.popitem(last=False)
    return sql, tuple(params)


PAGE_STATEMENTS = 256
_statements: OrderedDict[Hashable, tuple[Expression, str, tuple[Any, ...]]] = OrderedDict()
_statements_lock = threading.Lock()


def _compiled(document: Expression, using: str) -> RawSQL:
    """``document`` as the SQL it compiles to, compiled once per expression and vendor.

    Resolving and compiling an expression of fifty parts costs the ORM about
    2 ms, every time; the text does not change (it names only the job table's
    own columns, which every page query reads under the table's own name).
    """
    vendor = connections[using].vendor
    key = (id(document), vendor)
    kept = _documents.get(key)
    if kept is None or kept[0] is not document:
        query = Job.objects.using(using).annotate(document=document).query
        sql, params = query.get_compiler(using).compile(query.annotations["document"])
        kept = _documents[key] = (document, sql, tuple(params))
    return RawSQL(kept[1], kept[2], output_field=TextField())


_documents: dict[tuple[int, str], tuple[Expression, str, tuple[Any, ...]]] = {}


def job_ids_batches(
    filters: JobFilters, *, statuses: Sequence[str] | None = None, batch_size: int = 500
) -> Iterable[list[uuid.UUID]]:
    """Ids matching ``filters`` (and ``statuses``), ``batch_size`` at a time, newest first."""
    qs = job_queryset(filters)
    if statuses is not None:
        qs = qs.filter(status__in=list(statuses))
    return id_batches(qs, batch_size=batch_size)


def id_batches(
    queryset: QuerySet[Job],
    *,
    batch_size: int = 500,
    budget: int | None = None,
    bounded: bool = False,
) -> Iterable[list[uuid.UUID]]:
    """The ids of ``queryset``'s jobs, newest first, ``batch_size`` at a time.

    A keyset walk: the caller may change the jobs of one batch (cancel,
    retry) before asking for the next without skipping or repeating any.
    ``budget``: at most this many ids in all. ``bounded``: each page is read
    under ``bounded_reads`` (its own short read transaction), the writes the
    caller makes in between outside it.
    """
    qs = queryset.order_by("-created_at", "-id")
    cursor: JobCursor | None = None
    left = budget
    while left is None or left > 0:
        size = batch_size if left is None else min(batch_size, left)
        page = after_cursor(qs, cursor) if cursor else qs
        with bounded_reads(qs.db) if bounded else nullcontext():
            rows = list(page.values_list("created_at", "id")[:size])
        if not rows:
            return
        yield [r[1] for r in rows]
        if len(rows) < size:
            return
        if left is not None:
            left -= len(rows)
        cursor = JobCursor(rows[-1][0], rows[-1][1])


def job_count(
    filters: JobFilters | None = None,
    cap: int | None = None,
    *,
    fresh: bool = False,
    bounded: bool = False,
    estimate_table: bool = False,
) -> CountResult:
    """How many jobs match ``filters``, counted up to ``cap`` (see ``estimated_count``).

    A count of ``COUNT_CACHE_MIN_ROWS`` (1,000) jobs or more, or one that ran
    out of time, is reused for ``COUNT_CACHE_SECONDS`` (2 s) by this process
    for the same filters, cap and database (``counts.RecentCounts``): pollers
    of a big list would otherwise count the same 10,001 rows on every request.
    ``fresh=True`` always counts. ``bounded``: a count that runs, runs under the
    limits of ``bounded_reads`` (a count read from the cache costs no round trip).
    ``estimate_table``: with no filter at all, answer the planner's estimate of
    the whole table (``table_estimate``, PostgreSQL) when it is above ``cap``,
    counting nothing: what a page that is only looked at can afford.
    """
    cap = int(knob("COUNT_CAP") if cap is None else cap)
    if estimate_table and (filters is None or filters.is_empty):
        estimate = table_estimate(Job._meta.db_table, using=router.db_for_read(Job))
        if estimate is not None and estimate.value is not None and estimate.value > cap:
            return estimate

    def count() -> CountResult:
        queryset = job_queryset(filters)
        with bounded_reads(queryset.db) if bounded else nullcontext():
            return estimated_count(queryset, cap)

    if fresh:
        return count()
    try:
        # router.db_for_read(Job): where job_queryset's reads go (no queryset built for a hit)
        key: Hashable = (router.db_for_read(Job), type(filters), filters, cap)
        hash(key)
    except TypeError:  # filters holding a dict (a payload filter): nothing to key by
        return count()
    return recent_counts.get(key, count)


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
    """Events of a job with ``seq > after``, ascending, at most ``limit``; the implied
    ``job.enqueued`` included (``jobs.timeline``).

    A poller that passes the largest seq it has seen never misses or repeats
    one: seqs are taken under the job's row lock, so they commit in order.
    """
    stored = list(JobEvent.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")[:limit])
    if after >= 1 or (stored and stored[0].seq == 1):
        return stored
    created_at = Job.objects.filter(pk=job_id).values_list("created_at", flat=True).first()
    if created_at is None:  # no such job
        return stored
    return timeline.complete(stored, job_id=job_id, created_at=created_at, limit=limit)


MAX_SEQ = 2**31 - 1


def job_events_page(
    job_id: uuid.UUID, after: int = 0, limit: int = DEFAULT_EVENT_LIMIT
) -> tuple[int, list[JobEvent]] | None:
    """The job's last seq and its events with ``seq > after`` (at most ``limit``, ascending),
    in one statement; None when no such job.

    What pollers of ``GET /jobs/<id>/events`` call many times a second. Seqs
    have no gaps (``Job.last_event_seq`` is bumped under the job's row lock),
    so the page is the seq range ``(after, after + limit]``: a plain join on
    the unique ``(job, seq)`` index, no LIMIT, on SQLite as on PostgreSQL.
    The last seq and the events come from one snapshot.

    Read with a plain cursor, the rows typed by Django's own converters: a
    ``RawQuerySet`` costs ~175 us of set-up per call (column mapping,
    converters, model init order), most of a poll that finds nothing new.
    """
    using = router.db_for_read(JobEvent)  # as the ORM would route it (jobs.replica)
    d = dialect(using)
    after = min(after, MAX_SEQ)  # seq is a 32-bit column: nothing lies beyond
    with connections[using].cursor() as cursor:
        cursor.execute(_EVENTS_PAGE, [after, after + limit, d.uuid(job_id)])
        rows = cursor.fetchall()
    if not rows:
        return None
    last_seq, created_at = rows[0][-2:]
    if rows[0][0] is None:  # the job, and no stored event in the range
        stored = []
    else:
        stored = [_event_from_row(row[:-2], using) for row in rows]
    if after >= 1:
        return last_seq, stored
    (created_at,) = _typed(Job, _CREATED_AT, [created_at], using)
    return last_seq, timeline.complete(stored, job_id=job_id, created_at=created_at)


_EVENT_FIELDS = JobEvent._meta.concrete_fields  # from_db takes every field in this order
_EVENTS_PAGE = (
    f"SELECT {', '.join('e.' + field.column for field in _EVENT_FIELDS)}, j.last_event_seq, "
    "j.created_at "
    f"FROM {Job._meta.db_table} j LEFT JOIN {JobEvent._meta.db_table} e "
    "ON e.job_id = j.id AND e.seq > %s AND e.seq <= %s WHERE j.id = %s ORDER BY e.seq"
)
_converters: dict[tuple[str, str], list[tuple[Col, list[Any]]]] = {}


def _typed(
    model: type[Model], fields: Sequence[Any], values: Sequence[Any], using: str
) -> list[Any]:
    """Column values typed as the ORM would type them (SQLite hands back text, say)."""
    connection = connections[using]
    key = (connection.vendor, model._meta.label)
    converters = _converters.get(key)
    if converters is None:
        converters = _converters[key] = [
            (col, connection.ops.get_db_converters(col) + col.get_db_converters(connection))
            for col in (field.get_col(model._meta.db_table) for field in fields)
        ]
    typed = []
    for value, (col, column_converters) in zip(values, converters, strict=True):
        for convert in column_converters:
            value = convert(value, col, connection)
        typed.append(value)
    return typed


def _event_from_row(values: Sequence[Any], using: str) -> JobEvent:
    """A ``JobEvent`` as the ORM would build it from these column values."""
    typed = _typed(JobEvent, _EVENT_FIELDS, values, using)
    return JobEvent.from_db(using, [field.attname for field in _EVENT_FIELDS], typed)


_CREATED_AT = (Job._meta.get_field("created_at"),)
