"""The metrics rollup: the reaper folds new job events into per-minute sums.

Each reaper pass calls ``roll_up_metrics()``. It reads the events table
forward from a watermark (``MetricCursor.last_event_id``) along its primary
key, a batch of ids at a time, keeps the events that count, and adds them
to one ``MetricRollup`` row per (minute of the event, queue, operation) and
to the all-time ``MetricTotal`` row of that queue and operation, which the
Prometheus counters read. The completion path writes nothing for it: the
events it counts are the ones every transition writes anyway.

What counts (by event, in the minute of its ``ts``):

- started: ``job.started``; succeeded: ``job.succeeded``;
- failed: ``job.failed``, ``job.timeout``, ``job.lease_expired`` (every move to ``failed``);
- retried: ``job.retry_scheduled`` (a failed attempt with attempts left) and
  ``job.retry_later`` (the operation asked); an operator's retry is not counted;
- cancelled: ``job.cancelled``;
- lease expiries: ``job.lease_expired_requeue`` and ``job.lease_expired``;
- rescues: both of those, and ``job.timeout`` written by a reaper (not by the
  job's own worker or a remote worker's heartbeat).

Histograms: **wait** (ready -> started) is observed at each ``job.started``,
from the job's ``run_after`` (every move back to ``queued`` sets it to when the
job is ready again; never before ``created_at``). If the job has been requeued
since that start, ``run_after`` belongs to a later wait: the event before the
start is read instead (its ``ts`` plus its ``delay_seconds``; a job scheduled
for later at enqueue then counts from its enqueue). **Run** time is observed at
each end of a run (``job.succeeded``, ``job.failed``, ``job.timeout``,
``job.retry_scheduled``, ``job.retry_later``): the worker's own ``duration_ms``
on a success, otherwise from the run's ``job.started`` (the job's
``started_at`` while it is that run's, else that event). A deferred parent's
run lasts until it closes.

After the minutes, each call folds the quarters and hours that have become
final into ``MetricSpan`` rows for the dashboard's longer charts
(``jobs.metrics.spans``).

Exactly once with any number of reapers: a batch is read without locks, then
written in one transaction that first moves the watermark with a
conditional UPDATE (``WHERE last_event_id = <where we started>``); a reaper
whose UPDATE matches nothing lost the race and writes nothing. Running it
again reads nothing new.

Events are read only once they are ``METRICS_SETTLE_SECONDS`` old: ids are
taken at insert but become visible at commit, so a batch stops at the
newest id written before then. An event whose transaction commits later
than that (a host's own long transaction around a ``cancel``) is not
counted; the job's state is still right, only the counter misses it.
Events deleted by retention before the rollup read them (a reaper stopped
for longer than ``RETENTION_DAYS``) are not counted either.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, Q
from django.db.models.fields.json import KT
from django.utils import timezone

from jobs import events
from jobs.conf import knob
from jobs.metrics import buckets
from jobs.metrics.spans import fold_metric_spans, prune_metric_spans
from jobs.models import Job, JobEvent, MetricCursor, MetricRollup, MetricTotal
from jobs.tables import EVENT_TABLE, JOB_TABLE

EVENTS_CURSOR = "events"
# Event ids read per batch, and how long one call keeps reading while behind.
BATCH_IDS = 20_000
TIME_BUDGET_SECONDS = 5.0
# Lookups of a start or of the event before it, per query.
LOOKUP_CHUNK = 200
JOB_CHUNK = 2000

STARTED = events.JOB_STARTED
SUCCEEDED = events.JOB_SUCCEEDED
TIMEOUT = events.JOB_TIMEOUT
COUNTS: dict[str, tuple[str, ...]] = {
    STARTED: ("started",),
    SUCCEEDED: ("succeeded",),
    events.JOB_FAILED: ("failed",),
    TIMEOUT: ("failed",),
    events.JOB_LEASE_EXPIRED: ("failed", "lease_expiries", "rescues"),
    events.JOB_LEASE_EXPIRED_REQUEUE: ("lease_expiries", "rescues"),
    events.JOB_RETRY_SCHEDULED: ("retried",),
    events.JOB_RETRY_LATER: ("retried",),
    events.JOB_CANCELLED: ("cancelled",),
}
RUN_ENDS = frozenset(
    {SUCCEEDED, events.JOB_FAILED, TIMEOUT, events.JOB_RETRY_SCHEDULED, events.JOB_RETRY_LATER}
)
# ``by`` of a job.timeout that is not the reaper's rescue (jobs.timeouts).
NOT_RESCUES = frozenset({"worker", "heartbeat"})
COUNTERS = ("started", "succeeded", "failed", "retried", "cancelled", "lease_expiries", "rescues")


@dataclass
class Sums:
    """What one rollup row adds: counters and two histograms."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    lease_expiries: int = 0
    rescues: int = 0
    wait_counts: list[int] = field(default_factory=buckets.empty)
    wait_sum: float = 0.0
    run_counts: list[int] = field(default_factory=buckets.empty)
    run_sum: float = 0.0

    def observe_wait(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.wait_counts[buckets.slot(seconds)] += 1
        self.wait_sum += seconds

    def observe_run(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.run_counts[buckets.slot(seconds)] += 1
        self.run_sum += seconds

    def add_to(self, row: MetricRollup | MetricTotal) -> None:
        for name in COUNTERS:
            setattr(row, name, getattr(row, name) + getattr(self, name))
        row.wait_bucket_counts = buckets.added(row.wait_bucket_counts, self.wait_counts)
        row.run_bucket_counts = buckets.added(row.run_bucket_counts, self.run_counts)
        row.wait_sum += self.wait_sum
        row.run_sum += self.run_sum

    def merged(self, other: Sums) -> Sums:
        out = Sums()
        for name in COUNTERS:
            setattr(out, name, getattr(self, name) + getattr(other, name))
        out.wait_counts = buckets.added(self.wait_counts, other.wait_counts)
        out.run_counts = buckets.added(self.run_counts, other.run_counts)
        out.wait_sum, out.run_sum = self.wait_sum + other.wait_sum, self.run_sum + other.run_sum
        return out


Key = tuple[datetime, str, str]  # (minute, queue, operation)


@dataclass
class Batch:
    """The sums of the counted events with ids in (``after``, ``upto``]."""

    after: int
    upto: int
    events: int = 0
    sums: dict[Key, Sums] = field(default_factory=lambda: defaultdict(Sums))


@dataclass
class RollupResult:
    events: int = 0  # events counted
    batches: int = 0  # batches written
    caught_up: bool = False  # read up to the settled end of the events table
    lost_race: bool = False  # another reaper wrote a batch this one had read
    spans: int = 0  # quarter-hour and hour rows folded from final minutes (jobs.metrics.spans)


def roll_up_metrics(
    *,
    now: datetime | None = None,
    settle_seconds: float | None = None,
    batch_ids: int = BATCH_IDS,
    budget_seconds: float = TIME_BUDGET_SECONDS,
) -> RollupResult:
    """Add the events written since the last call to the rollup; return what it did.

    Reads batches of ``batch_ids`` event ids until it reaches events younger
    than ``settle_seconds`` (knob ``METRICS_SETTLE_SECONDS``) or has spent
    ``budget_seconds``; the next call goes on from there.
    """
    now = now or timezone.now()
    settle = float(knob("METRICS_SETTLE_SECONDS") if settle_seconds is None else settle_seconds)
    cutoff = now - timedelta(seconds=settle)
    result = RollupResult()
    deadline = time.monotonic() + budget_seconds
    cursor, _ = MetricCursor.objects.get_or_create(name=EVENTS_CURSOR)
    after = cursor.last_event_id
    while True:
        batch = read_batch(after, cutoff, batch_ids)
        if batch is None:
            result.caught_up = True
            MetricCursor.objects.filter(name=EVENTS_CURSOR, last_event_id=after).update(
                rolled_up_at=now
            )
            break
        if not write_batch(batch, now):
            result.lost_race = True
            break
        result.events += batch.events
        result.batches += 1
        after = batch.upto
        if time.monotonic() > deadline:
            break
    result.spans = fold_metric_spans(cutoff=cutoff, read_upto=after)
    return result


def read_batch(after: int, cutoff: datetime, batch_ids: int = BATCH_IDS) -> Batch | None:
    """Sum the counted events after id ``after``, up to ``batch_ids`` ids on, written by ``cutoff``.

    None when there is nothing settled to read. The batch starts at the first
    event after ``after`` (ids deleted by retention are skipped) and ends at
    the newest id of its range written by ``cutoff``.
    """
    first = (
        JobEvent.objects.filter(id__gt=after).order_by("id").values_list("id", flat=True).first()
    )
    if first is None:
        return None
    upto = JobEvent.objects.filter(
        id__gt=after, id__lt=first + batch_ids, ts__lte=cutoff
    ).aggregate(upto=Max("id"))["upto"]
    if upto is None:
        return None
    batch = Batch(after=after, upto=upto)
    if connection.vendor == "postgresql":
        _sum_in_database(batch)
    else:
        _sum_in_python(batch)
    return batch


def _sum_in_python(batch: Batch) -> None:
    """Every counted event of the batch read as a row and summed here (SQLite)."""
    events = list(
        JobEvent.objects.filter(id__gt=batch.after, id__lte=batch.upto, event__in=list(COUNTS))
        .order_by("id")
        .annotate(duration_ms=KT("fields__duration_ms"), timeout_by=KT("fields__by"))
        .values_list("job_id", "seq", "ts", "event", "duration_ms", "timeout_by")
    )
    jobs = _jobs({event[0] for event in events})
    unknown_ready: list[tuple[Sums, uuid.UUID, int, datetime, datetime]] = []
    unknown_start: list[tuple[Sums, uuid.UUID, int, datetime]] = []
    for job_id, seq, ts, event, ms, by in events:
        job = jobs.get(job_id)
        if job is None:
            continue  # deleted since (retention, a purge): its event is gone with it
        queue, operation, created, run_after, started_at = job
        sums = batch.sums[(ts.replace(second=0, microsecond=0), queue, operation)]
        batch.events += 1
        for name in COUNTS[event]:
            setattr(sums, name, getattr(sums, name) + 1)
        if event == TIMEOUT and (by or "reaper") not in NOT_RESCUES:
            sums.rescues += 1
        if event == STARTED:
            if run_after is not None and run_after <= ts:
                # No requeue since: run_after is still the one this start waited for.
                sums.observe_wait((ts - max(run_after, created)).total_seconds())
            else:
                unknown_ready.append((sums, job_id, seq, ts, created))
        elif event in RUN_ENDS:
            if event == SUCCEEDED and ms is not None:
                sums.observe_run(float(ms) / 1000.0)
            else:
                _observe_run_end(sums, job_id, seq, ts, started_at, unknown_start)
    _observe_unknown_waits(unknown_ready)
    _observe_unknown_runs(unknown_start)


def _observe_run_end(
    sums: Sums,
    job_id: uuid.UUID,
    seq: int,
    ts: datetime,
    started_at: datetime | None,
    unknown_start: list[tuple[Sums, uuid.UUID, int, datetime]],
) -> None:
    if started_at is not None and started_at <= ts:
        # Not claimed again since (a new claim would start after this end).
        sums.observe_run((ts - started_at).total_seconds())
    else:
        unknown_start.append((sums, job_id, seq, ts))


def _sum_in_database(batch: Batch) -> None:
    """The batch summed by PostgreSQL (``SUMS_SQL``): only the sums cross the wire.

    Reading every event as a Python row cost the reaper about 50 us an event,
    as much CPU as a worker process spends running the jobs. The rows the
    SQL cannot place alone (a start whose job was requeued since, a run end
    without the worker's duration) come back one by one and are placed as
    ``_sum_in_python`` places them.
    """
    unknown_ready: list[tuple[Sums, uuid.UUID, int, datetime, datetime]] = []
    unknown_start: list[tuple[Sums, uuid.UUID, int, datetime]] = []
    with connection.cursor() as cursor:
        cursor.execute(
            SUMS_SQL,
            {
                "after": batch.after,
                "upto": batch.upto,
                "events": list(COUNTS),
                "bounds": NEGATED_BOUNDS,
            },
        )
        for row in cursor.fetchall():
            minute, queue, operation = row[1], row[2], row[3]
            sums = batch.sums[(minute, queue, operation)]
            if row[0] == "sum":
                wait_slot, run_slot, n, wait_sum, run_sum = row[4:9]
                counters = row[9 : 9 + len(COUNTERS)]
                batch.events += n
                for name, add in zip(COUNTERS, counters, strict=True):
                    setattr(sums, name, getattr(sums, name) + add)
                if wait_slot is not None:
                    sums.wait_counts[wait_slot] += n
                    sums.wait_sum += wait_sum
                if run_slot is not None:
                    sums.run_counts[run_slot] += n
                    sums.run_sum += run_sum
                continue
            job_id, seq, ts, event, created, started_at = row[9 + len(COUNTERS) :]
            if event == STARTED:
                unknown_ready.append((sums, job_id, seq, ts, created))
            else:
                _observe_run_end(sums, job_id, seq, ts, started_at, unknown_start)
    _observe_unknown_waits(unknown_ready)
    _observe_unknown_runs(unknown_start)


def _counter_sql(name: str) -> str:
    events = ", ".join(f"'{event}'" for event, adds in COUNTS.items() if name in adds)
    condition = f"event IN ({events})"
    if name == "rescues":
        not_rescues = ", ".join(f"'{by}'" for by in sorted(NOT_RESCUES))
        by = "coalesce(timeout_by, 'reaper')"
        condition += f" OR (event = '{TIMEOUT}' AND {by} NOT IN ({not_rescues}))"
    return f"count(*) FILTER (WHERE {condition})"


# bisect_left(BOUNDS, s), the number of bounds below s, is len(BOUNDS) minus
# the number of negated bounds at or below -s, which is what width_bucket counts.
NEGATED_BOUNDS = sorted(-bound for bound in buckets.BOUNDS)
_NULLS = ", ".join(["NULL"] * len(COUNTERS))
_RUN_ENDS = ", ".join(f"'{event}'" for event in sorted(RUN_ENDS))
# The job is looked up per event by primary key (OFFSET 0 keeps the planner
# from turning the lookups into a hash join over the whole jobs table).
SUMS_SQL = f"""
WITH e AS MATERIALIZED (
    SELECT e.job_id, e.seq, e.ts, e.event, date_trunc('minute', e.ts) AS minute,
           e.fields->>'by' AS timeout_by, j.queue, j.operation, j.created_at, j.started_at,
           CASE WHEN e.event = '{STARTED}' AND j.run_after <= e.ts
                THEN greatest(extract(epoch FROM e.ts - greatest(j.run_after, j.created_at)), 0)
           END::float8 AS wait,
           CASE WHEN e.event = '{SUCCEEDED}' AND jsonb_typeof(e.fields->'duration_ms') = 'number'
                THEN greatest((e.fields->>'duration_ms')::float8 / 1000.0, 0)
           END AS run
    FROM {EVENT_TABLE} e
    CROSS JOIN LATERAL (
        SELECT queue, operation, created_at, run_after, started_at
        FROM {JOB_TABLE} WHERE id = e.job_id OFFSET 0
    ) j
    WHERE e.id > %(after)s AND e.id <= %(upto)s AND e.event = ANY(%(events)s)
)
SELECT 'sum', minute, queue, operation,
       CASE WHEN wait IS NOT NULL THEN {len(buckets.BOUNDS)} - width_bucket(-wait, %(bounds)s) END,
       CASE WHEN run IS NOT NULL THEN {len(buckets.BOUNDS)} - width_bucket(-run, %(bounds)s) END,
       count(*), coalesce(sum(wait), 0), coalesce(sum(run), 0),
       {", ".join(_counter_sql(name) for name in COUNTERS)},
       NULL::uuid, NULL::int, NULL::timestamptz, NULL, NULL::timestamptz, NULL::timestamptz
FROM e GROUP BY 2, 3, 4, 5, 6
UNION ALL
SELECT 'row', minute, queue, operation, NULL, NULL, NULL, NULL, NULL, {_NULLS},
       job_id, seq, ts, event, created_at, started_at
FROM e
WHERE (event = '{STARTED}' AND wait IS NULL) OR (event IN ({_RUN_ENDS}) AND run IS NULL)
"""


def _jobs(ids: set[uuid.UUID]) -> dict[uuid.UUID, tuple[Any, ...]]:
    """The columns the rollup needs of these jobs, by primary key (never a join that the
    planner could turn into a scan of the whole jobs table)."""
    found: dict[uuid.UUID, tuple[Any, ...]] = {}
    for chunk in _chunks(sorted(ids), JOB_CHUNK):
        rows = Job.objects.filter(pk__in=list(chunk)).values_list(
            "id", "queue", "operation", "created_at", "run_after", "started_at"
        )
        found.update((row[0], row[1:]) for row in rows)
    return found


def _chunks(items: Sequence[Any], size: int = LOOKUP_CHUNK) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _observe_unknown_waits(pending: list[tuple[Sums, uuid.UUID, int, datetime, datetime]]) -> None:
    """Waits of starts whose job was requeued since: from the event just before each start."""
    before: dict[tuple[uuid.UUID, int], tuple[datetime, float]] = {}
    for chunk in _chunks(pending):
        match = Q()
        for _, job_id, seq, _, _ in chunk:
            match |= Q(job_id=job_id, seq=seq - 1)
        rows = (
            JobEvent.objects.filter(match)
            .annotate(delay=KT("fields__delay_seconds"))
            .values_list("job_id", "seq", "ts", "delay")
        )
        for job_id, seq, ts, delay in rows:
            before[(job_id, seq)] = (ts, _seconds(delay))
    for sums, job_id, seq, ts, created in pending:
        previous = before.get((job_id, seq - 1))
        ready = previous[0] + timedelta(seconds=previous[1]) if previous else created
        sums.observe_wait((ts - ready).total_seconds())


def _observe_unknown_runs(pending: list[tuple[Sums, uuid.UUID, int, datetime]]) -> None:
    """Runs whose job was claimed again (or requeued) since they ended: from their job.started."""
    starts: dict[uuid.UUID, list[tuple[int, datetime]]] = defaultdict(list)
    job_ids = sorted({job_id for _, job_id, _, _ in pending})
    for chunk in _chunks(job_ids):
        rows = JobEvent.objects.filter(job_id__in=list(chunk), event=STARTED).values_list(
            "job_id", "seq", "ts"
        )
        for job_id, seq, ts in rows:
            starts[job_id].append((seq, ts))
    for sums, job_id, seq, ts in pending:
        earlier = [s for s in starts.get(job_id, ()) if s[0] < seq]
        if earlier:
            sums.observe_run((ts - max(earlier)[1]).total_seconds())


def _seconds(value: Any) -> float:
    try:
        return max(float(value), 0.0) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


def write_batch(batch: Batch, now: datetime) -> bool:
    """Move the watermark over ``batch`` and add its sums, in one transaction.

    False, writing nothing, when the watermark is no longer where the batch
    started: another reaper wrote this range first.
    """
    with transaction.atomic():
        moved = MetricCursor.objects.filter(name=EVENTS_CURSOR, last_event_id=batch.after).update(
            last_event_id=batch.upto, rolled_up_at=now
        )
        if not moved:
            return False
        # From here on the cursor row's lock (PostgreSQL) or the write lock
        # (SQLite) keeps other rollups out until commit: read-modify-write is safe.
        _add_minutes(batch.sums)
        totals: dict[tuple[str, str], Sums] = {}
        for (_, queue, operation), sums in batch.sums.items():
            key = (queue, operation)
            totals[key] = totals[key].merged(sums) if key in totals else sums
        _add_totals(totals)
    return True


def _add_minutes(sums: dict[Key, Sums]) -> None:
    if not sums:
        return
    minutes = {key[0] for key in sums}
    existing = {
        (row.minute, row.queue, row.operation): row
        for row in MetricRollup.objects.filter(
            minute__in=minutes,
            queue__in={key[1] for key in sums},
            operation__in={key[2] for key in sums},
        )
    }
    _save(
        MetricRollup,
        existing,
        sums,
        lambda key: {"minute": key[0], "queue": key[1], "operation": key[2]},
    )


def _add_totals(sums: dict[tuple[str, str], Sums]) -> None:
    if not sums:
        return
    existing = {
        (row.queue, row.operation): row
        for row in MetricTotal.objects.filter(
            queue__in={key[0] for key in sums}, operation__in={key[1] for key in sums}
        )
    }
    _save(MetricTotal, existing, sums, lambda key: {"queue": key[0], "operation": key[1]})


FIELDS = [*COUNTERS, "wait_bucket_counts", "wait_sum", "run_bucket_counts", "run_sum"]


def _save(model: Any, existing: dict[Any, Any], sums: dict[Any, Sums], identity: Any) -> None:
    changed, created = [], []
    for key, add in sums.items():
        row = existing.get(key)
        if row is None:
            row = model(
                **identity(key),
                wait_bucket_counts=buckets.empty(),
                run_bucket_counts=buckets.empty(),
            )
            created.append(row)
        else:
            changed.append(row)
        add.add_to(row)
    if changed:
        model.objects.bulk_update(changed, FIELDS, batch_size=500)
    if created:
        model.objects.bulk_create(created, batch_size=500)


def prune_metric_rollups(
    *, now: datetime | None = None, limit: int = 1000, rounds: int = 10
) -> int:
    """Delete minute (and span) rows older than ``METRICS_RETENTION_DAYS``, at most
    ``rounds`` x ``limit`` of each.

    The all-time totals stay: counters never go down. Several reapers may
    prune at once (the DELETE repeats the age condition).
    """
    now = now or timezone.now()
    cutoff = now - timedelta(days=float(knob("METRICS_RETENTION_DAYS")))
    deleted = 0
    for _ in range(rounds):
        ids = list(
            MetricRollup.objects.filter(minute__lt=cutoff)
            .order_by("minute")
            .values_list("pk", flat=True)[:limit]
        )
        if not ids:
            break
        n, _ = MetricRollup.objects.filter(pk__in=ids, minute__lt=cutoff).delete()
        deleted += n
        if len(ids) < limit:
            break
    return deleted + prune_metric_spans(cutoff=cutoff, limit=limit, rounds=rounds)
