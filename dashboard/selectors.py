"""Dashboard-only reads, each shaped to stay on an index at a million jobs.

General reads (the keyset cursor, a job's events after a seq) come from
``jobs.selectors``; what is here serves pages the REST API does not have:
per-queue counts capped at ``COUNT_CAP`` (never a full ``COUNT(*)``), the
throughput chart, failures grouped by error, orphaned jobs and what the
reaper reclaimed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count as DbCount
from django.db.models import Min, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left, TruncMinute
from django.utils import timezone

from dashboard.conf import setting
from jobs.dialect import dialect
from jobs.events import RECLAIM_EVENTS
from jobs.failures import FINGERPRINT_MESSAGE_CHARS, fingerprint
from jobs.models import BatchMessage, Job, JobEvent, KeyLimit, Queue, QueueKind, Worker
from jobs.replica import read_connection
from jobs.retention import FINAL_STATUSES, current_retention
from jobs.selectors import JobCursor, JobFilters, after_cursor
from jobs.selectors.counts import CountResult, capped_count, count_cap
from jobs.selectors.workers import live_worker_ids, stale_before
from jobs.states import FAILED, QUEUED, RUNNING, SUCCEEDED, Status
from jobs.tables import JOB_TABLE
from jobs.waiting import has_run, waiting_of

STATES: tuple[str, ...] = tuple(s.value for s in Status)
LIST_FIELDS = (
    "id",
    "operation",
    "queue",
    "status",
    "priority",
    "attempts",
    "max_attempts",
    "created_at",
    "started_at",
    "finished_at",
    "run_after",
    "waiting_for",
    "workflow_id",
    "step",
    "error_code",
    "progress_current",
    "progress_total",
    "parent_id",
    "worker_id",
    "leased_until",
)


# --- job list --------------------------------------------------------------


def before_cursor(qs, cursor: JobCursor):
    """Rows strictly newer than ``cursor`` (the mirror of ``after_cursor``)."""
    return qs.filter(created_at__gte=cursor.created_at).filter(
        Q(created_at__gt=cursor.created_at) | Q(id__gt=cursor.id)
    )


@dataclass
class JobPage:
    jobs: list[Job]
    next_cursor: str | None
    prev_cursor: str | None


def job_page(
    filters: JobFilters, *, after: str = "", before: str = "", limit: int | None = None
) -> JobPage:
    """One page of the newest-first list, keyset-paginated both ways on (created_at, id)."""
    limit = int(limit or setting("PAGE_SIZE"))
    qs = filters.apply(_list_rows())
    if before:
        cursor = JobCursor.decode(before)
        rows = list(before_cursor(qs, cursor).order_by("created_at", "id")[: limit + 1])
        newer_exists = len(rows) > limit
        rows = list(reversed(rows[:limit]))
        older_exists = True
    else:
        if after:
            qs = after_cursor(qs, JobCursor.decode(after))
        rows = list(qs.order_by("-created_at", "-id")[: limit + 1])
        older_exists = len(rows) > limit
        rows = rows[:limit]
        newer_exists = bool(after)

    def token(job: Job) -> str:
        return JobCursor(job.created_at, job.id).encode()

    return JobPage(
        jobs=_with_waiting(rows),
        next_cursor=token(rows[-1]) if rows and older_exists else None,
        prev_cursor=token(rows[0]) if rows and newer_exists else None,
    )


def job_rows(ids: Iterable[uuid.UUID | str]) -> list[Job]:
    """The list columns of some jobs (for re-rendering rows that changed)."""
    ids = list(ids)
    return _with_waiting(list(_list_rows().filter(pk__in=ids))) if ids else []


def _list_rows():
    """The list's columns, and whether each job ran before (for its badge)."""
    return Job.objects.only(*LIST_FIELDS).annotate(has_run=has_run())


def _with_waiting(jobs: list[Job]) -> list[Job]:
    """Set ``job.waiting`` (``jobs.waiting``): why a queued row waits, for its badge."""
    now = timezone.now()
    for job in jobs:
        job.waiting = waiting_of(job, now)
    return jobs


# --- queues ------------------------------------------------------------------


def queue_names(limit: int = 1000) -> list[str]:
    """Every queue named by a job or a Queue row.

    A loose index scan (one ``MIN(queue) > previous`` probe per queue on the
    ``(queue, status)`` index) instead of ``SELECT DISTINCT`` over every row.
    """
    sql = (
        "WITH RECURSIVE q(name, n) AS ("
        f" SELECT MIN(queue), 1 FROM {JOB_TABLE}"
        " UNION ALL"
        f" SELECT (SELECT MIN(queue) FROM {JOB_TABLE} WHERE queue > q.name), n + 1"
        " FROM q WHERE q.name IS NOT NULL AND n < %s"
        ") SELECT name FROM q WHERE name IS NOT NULL"
    )
    with read_connection().cursor() as cursor:  # the replica inside on_replica
        cursor.execute(sql, [limit])
        names = {row[0] for row in cursor.fetchall()}
    names |= set(Queue.objects.values_list("name", flat=True))
    return sorted(names)


def queue_state_counts(names: Sequence[str]) -> dict[str, dict[str, CountResult]]:
    """Counts by state for each queue, each capped at ``COUNT_CAP``, in one statement."""
    if not names:
        return {}
    limit = count_cap()
    parts, params = [], []
    for name in names:
        for state in STATES:
            parts.append(
                f"SELECT %s, %s, (SELECT COUNT(*) FROM (SELECT 1 FROM {JOB_TABLE}"
                " WHERE queue = %s AND status = %s LIMIT %s) AS t)"
            )
            params += [name, state, name, state, limit + 1]
    out: dict[str, dict[str, CountResult]] = {n: {} for n in names}
    with read_connection().cursor() as cursor:  # the replica inside on_replica
        cursor.execute(" UNION ALL ".join(parts), params)
        for name, state, n in cursor.fetchall():
            out[name][state] = CountResult(min(n, limit), capped=n > limit)
    return out


def batch_message_counts(
    names: Sequence[str], now: datetime | None = None
) -> dict[str, dict[str, CountResult]]:
    """Messages of each batch queue by state, each capped at ``COUNT_CAP``, in one statement.

    A batch queue has no Job rows; its work is ``BatchMessage`` rows with a
    visibility timeout (``jobs.batches``). *In flight*: invisible, held by a
    consumer (or waiting out the backoff of a failed attempt). *Waiting*:
    visible, with deliveries left. *Dead*: visible with every delivery spent
    (each consumer died mid-batch); the next claim fails its parent instead
    of handing it out. Two ranges of the ``(queue, visible_after)`` index per
    queue, each read at most ``COUNT_CAP + 1`` entries deep; past the cap the
    visible rows read first (the oldest) decide the split, and both counts
    say they are capped.
    """
    if not names:
        return {}
    d = dialect()
    table = BatchMessage._meta.db_table
    limit = count_cap()
    at = d.ts(now or timezone.now())
    parts, params = [], []
    for name in names:
        parts.append(
            f"SELECT %s, (SELECT COUNT(*) FROM (SELECT 1 FROM {table}"
            " WHERE queue = %s AND visible_after > %s LIMIT %s) AS h), v.n, v.dead"
            " FROM (SELECT COUNT(*) AS n,"
            " COALESCE(SUM(CASE WHEN attempts >= max_attempts THEN 1 ELSE 0 END), 0) AS dead"
            f" FROM (SELECT attempts, max_attempts FROM {table}"
            " WHERE queue = %s AND visible_after <= %s ORDER BY visible_after LIMIT %s) AS m) AS v"
        )
        params += [name, name, at, limit + 1, name, at, limit + 1]
    out: dict[str, dict[str, CountResult]] = {}
    with read_connection().cursor() as cursor:  # the replica inside on_replica
        cursor.execute(" UNION ALL ".join(parts), params)
        for name, hidden, visible, dead in cursor.fetchall():
            capped = visible > limit
            out[name] = {
                "waiting": CountResult(min(visible - dead, limit), capped=capped),
                "in_flight": CountResult(min(hidden, limit), capped=hidden > limit),
                "dead": CountResult(int(dead), capped=capped),
            }
    return out


def oldest_ready(now: datetime | None = None) -> dict[str, datetime]:
    """Per queue, since when its longest-waiting claimable job has been ready.

    Reads only queued rows (the partial claim index), never finished ones;
    a job scheduled for later is not waiting yet, so it does not count.
    """
    now = now or timezone.now()
    rows = (
        Job.objects.filter(status=QUEUED, run_after__lte=now)
        .order_by()
        .values_list("queue")
        .annotate(oldest=Min("run_after"))
    )
    return dict(rows)


@dataclass(frozen=True)
class RetentionCell:
    """How long a queue keeps its finished jobs of one status, and what says so: ``queue``
    (an operator, on the queues page), ``settings``, ``status`` or ``default``."""

    status: str
    days: float
    source: str
    set_days: float | None = None  # the operator's value for this status, if any

    @property
    def text(self) -> str:
        return f"{self.days:g}"

    @property
    def set_text(self) -> str:
        return "" if self.set_days is None else f"{self.set_days:g}"


@dataclass
class QueueRow:
    name: str
    kind: str
    paused: bool
    concurrency_cap: int | None
    counts: dict[str, CountResult]
    oldest_ready: datetime | None
    # A batch queue's messages by state (``batch_message_counts``); None for a job queue.
    messages: dict[str, CountResult] | None = None
    rate_limit_per_second: float | None = None  # jobs started per second, cluster-wide
    # The retention in force per final status (jobs.retention).
    retention: list[RetentionCell] = field(default_factory=list)

    @property
    def rate_text(self) -> str:
        """The rate limit as typed ("5", "0.5"), empty for none."""
        rate = self.rate_limit_per_second
        return "" if rate is None else f"{rate:g}"

    @property
    def active(self) -> bool:
        if self.messages is not None:
            return any(c.value for c in self.messages.values())
        return bool(
            self.counts.get(QUEUED, CountResult(0)).value
            or self.counts.get(RUNNING, CountResult(0)).value
        )


def queue_rows() -> list[QueueRow]:
    """Every queue with its settings, capped counts by state and oldest ready job;
    a batch queue also with its messages by state."""
    names = queue_names()
    settings = {q.name: q for q in Queue.objects.filter(name__in=names)}
    kinds = {n: settings[n].kind if n in settings else Queue.default_kind(n) for n in names}
    counts = queue_state_counts(names)
    messages = batch_message_counts([n for n in names if kinds[n] == QueueKind.BATCH])
    oldest = oldest_ready()
    rules = current_retention()
    rows = []
    for name in names:
        q = settings.get(name)
        chosen = (q.retention_days if q else None) or {}
        retention = [
            RetentionCell(
                status,
                *rules.explain(name, status),
                set_days=chosen.get(status) if isinstance(chosen, dict) else None,
            )
            for status in FINAL_STATUSES
        ]
        rows.append(
            QueueRow(
                name=name,
                kind=kinds[name],
                paused=bool(q and q.paused),
                concurrency_cap=q.concurrency_cap if q else None,
                counts=counts.get(name, {}),
                oldest_ready=oldest.get(name),
                messages=messages.get(name),
                rate_limit_per_second=q.rate_limit_per_second if q else None,
                retention=retention,
            )
        )
    return rows


def key_limit_rows(limit: int = 500) -> list[KeyLimit]:
    """Every flow key limit (families and single keys), by name: the queues page's table."""
    return list(KeyLimit.objects.order_by("name")[:limit])


# --- throughput and failures ---------------------------------------------------


@dataclass
class Minute:
    at: datetime
    succeeded: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.succeeded + self.failed


def throughput(minutes: int = 60, now: datetime | None = None) -> list[Minute]:
    """Jobs finished per minute over the last ``minutes`` (the (status, finished_at) index)."""
    now = (now or timezone.now()).replace(second=0, microsecond=0)
    start = now - timedelta(minutes=minutes - 1)
    buckets = {
        start + timedelta(minutes=i): Minute(start + timedelta(minutes=i)) for i in range(minutes)
    }
    rows = (
        Job.objects.filter(status__in=[SUCCEEDED, FAILED], finished_at__gte=start)
        .order_by()
        .annotate(minute=TruncMinute("finished_at"))
        .values_list("minute", "status")
        .annotate(n=DbCount("id"))
    )
    for minute, status, n in rows:
        bucket = buckets.get(minute)
        if bucket is not None:
            setattr(bucket, status, getattr(bucket, status) + n)
    return list(buckets.values())


@dataclass
class FailureGroup:
    error_code: str
    operation: str
    count: int
    last_at: datetime
    sample_id: uuid.UUID | None = None
    sample_message: str = ""
    fingerprint: str = ""
    # Set when the window held more failures than were read: the counts are of
    # the latest ``sample_size`` failures.
    sample_size: int | None = None


# The latest failed jobs of the window that ``recent_failures`` reads (one
# backward range of the (status, finished_at) index), and how many of their
# failure events one query fetches (an OR of (job, seq) pairs, each a probe of
# the unique index; SQLite bounds the depth of an expression).
FAILURE_SAMPLE = 500
FAILURE_EVENTS_PER_QUERY = 250


def _failure_fingerprints(pairs: Sequence[tuple[uuid.UUID, int]]) -> dict[uuid.UUID, str]:
    """The ``fingerprint`` field of each (job, seq) event that has one, by job id."""
    found: dict[uuid.UUID, str] = {}
    for start in range(0, len(pairs), FAILURE_EVENTS_PER_QUERY):
        match = Q()
        for job_id, seq in pairs[start : start + FAILURE_EVENTS_PER_QUERY]:
            match |= Q(job_id=job_id, seq=seq)
        rows = JobEvent.objects.filter(match).values_list("job_id", KT("fields__fingerprint"))
        found.update((job_id, mark) for job_id, mark in rows if mark)
    return found


def recent_failures(hours: float | None = None, limit: int = 8) -> list[FailureGroup]:
    """Failed jobs of the recent window grouped by (failure fingerprint, operation), most first.

    A fingerprint (``jobs.failures``) names the error class, the message with
    its ids and numbers collapsed, and the raising frame: two messages are
    two rows. It is read from each job's failure event, which is its last
    event; a failure recorded without one (before fingerprints, or by the
    reaper) gets one computed from its error class and message. Only the
    latest ``FAILURE_SAMPLE`` failures of the window are read.
    """
    since = timezone.now() - timedelta(hours=hours or setting("FAILURE_WINDOW_HOURS"))
    rows = list(
        Job.objects.filter(status=FAILED, finished_at__gte=since)
        .order_by("-finished_at")
        .annotate(message=Left("error_message", FINGERPRINT_MESSAGE_CHARS))
        .values_list("id", "operation", "error_code", "message", "finished_at", "last_event_seq")[
            : FAILURE_SAMPLE + 1
        ]
    )
    sampled = len(rows) > FAILURE_SAMPLE
    rows = rows[:FAILURE_SAMPLE]
    stored = _failure_fingerprints([(row[0], row[5]) for row in rows])
    groups: dict[tuple[str, str], FailureGroup] = {}
    for job_id, op, code, message, finished_at, _seq in rows:  # newest first
        message = message or ""
        mark = stored.get(job_id) or fingerprint(code, message)
        group = groups.get((mark, op))
        if group is None:
            groups[(mark, op)] = FailureGroup(
                error_code=code,
                operation=op,
                count=1,
                last_at=finished_at,
                sample_id=job_id,
                sample_message=message[:300],
                fingerprint=mark,
                sample_size=FAILURE_SAMPLE if sampled else None,
            )
        else:
            group.count += 1
    # Most first; among equals the most recent (the dict keeps newest-first order).
    return sorted(groups.values(), key=lambda g: -g.count)[:limit]


# --- workers -------------------------------------------------------------------


@dataclass
class WorkerRow:
    worker: Worker
    stale: bool
    current: list[Job] = field(default_factory=list)


def worker_rows() -> list[WorkerRow]:
    """Every worker, live ones first, with the jobs it is running."""
    cutoff = stale_before()
    workers = list(Worker.objects.order_by("hostname", "pid", "started_at"))
    rows = {w.pk: WorkerRow(worker=w, stale=w.last_heartbeat < cutoff) for w in workers}
    if rows:
        running = Job.objects.filter(status=RUNNING, worker_id__in=list(rows)).only(*LIST_FIELDS)
        for job in running.order_by("started_at")[:2000]:
            rows[job.worker_id].current.append(job)
    return sorted(rows.values(), key=lambda r: (r.stale, r.worker.hostname, r.worker.pid or 0))


def _orphans():
    return Job.objects.filter(status=RUNNING, lease_token__isnull=False).exclude(
        worker_id__in=live_worker_ids()
    )


def orphaned_jobs(limit: int = 50) -> list[Job]:
    """Running jobs held by a worker that is stale or gone (deferred coordinators excluded).

    A deferred coordinator is ``running`` without a lease token: it waits for
    its batches, not for a worker, so it is never an orphan.
    """
    return list(_orphans().only(*LIST_FIELDS).order_by("started_at")[:limit])


def orphan_count() -> CountResult:
    return capped_count(_orphans())


def workers_alive() -> tuple[int, int]:
    """(alive, stale) worker counts."""
    cutoff = stale_before()
    stats = Worker.objects.aggregate(
        alive=DbCount("pk", filter=Q(last_heartbeat__gte=cutoff)),
        stale=DbCount("pk", filter=Q(last_heartbeat__lt=cutoff)),
    )
    return stats["alive"], stats["stale"]


# --- reaper --------------------------------------------------------------------


@dataclass
class Reclaims:
    counts: dict[str, int]
    recent: list[JobEvent]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def reclaimed_recently(hours: float | None = None, limit: int = 25) -> Reclaims:
    """What the reaper did in the recent window: requeued or failed leases, timeouts."""
    since = timezone.now() - timedelta(hours=hours or setting("RECLAIM_WINDOW_HOURS"))
    events = JobEvent.objects.filter(ts__gte=since, event__in=RECLAIM_EVENTS)
    counts = dict.fromkeys(RECLAIM_EVENTS, 0)
    for name, n in events.order_by().values_list("event").annotate(n=DbCount("id")):
        counts[name] = n
    recent = list(
        events.select_related("job")
        .only(
            "id",
            "seq",
            "ts",
            "event",
            "level",
            "message",
            "job__id",
            "job__queue",
            "job__operation",
            "job__status",
        )
        .order_by("-ts")[:limit]
    )
    return Reclaims(counts=counts, recent=recent)
