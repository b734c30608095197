"""The Prometheus collector behind ``GET /metrics``: every figure read from the database per scrape.

Counters and histograms are the reaper's all-time sums (``MetricTotal``,
``jobs.metrics.rollup``); gauges are read live, each on an index and with a
bound on the work: job counts by queue and state stop at ``COUNT_CAP`` rows
(past it PostgreSQL's planner estimate is given, SQLite counts), the oldest
ready job is one index probe per priority in use, and queue names come from
a loose index scan. Labels are queue, operation, state and schedule names:
never a job id. At most ``MAX_SERIES_ROWS`` queues, (queue, operation) pairs
and schedules are exported. Flow keys are exported by family, never by key
(``held_back_keys``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import F, QuerySet
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from jobs.conf import knob
from jobs.dialect import dialect
from jobs.metrics import buckets
from jobs.metrics.rollup import EVENTS_CURSOR
from jobs.models import (
    BatchMessage,
    Job,
    MetricCursor,
    MetricTotal,
    Queue,
    QueueKind,
    Schedule,
    Worker,
)
from jobs.replica import read_connection
from jobs.selectors.counts import planner_estimate
from jobs.selectors.flow_keys import held_back_by_family
from jobs.states import QUEUED, Status

PREFIX = "controlplane"
MAX_SERIES_ROWS = 1000
# Queues per capped-count statement (SQLite allows 500 terms in one UNION).
QUEUES_PER_STATEMENT = 40
STATES: tuple[str, ...] = tuple(s.value for s in Status)
BATCH_STATES = ("waiting", "in_flight", "dead")
COUNTER_HELP = {
    "started": "Runs started (job.started).",
    "succeeded": "Jobs that succeeded.",
    "failed": "Jobs that failed for good (failures, timeouts, lease expiries past the budget).",
    "retried": "Failed or postponed runs scheduled to run again (automatic retries).",
    "cancelled": "Jobs cancelled.",
}


class DatabaseCollector:
    """Yields every control-plane metric, read from the database when collected."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now or timezone.now()
        names = queue_names()
        yield jobs_by_state(names)
        yield oldest_ready_age(names, now)
        yield workers_alive(names, now)
        yield batch_messages(names, now)
        yield schedule_lag(now)
        yield from held_back_keys()
        yield from rollup_totals()
        yield rollup_age(now)


# --- queues -----------------------------------------------------------------------


def _distinct(table: str, column: str, limit: int) -> list[str]:
    """Distinct values of an indexed column by a loose index scan: one probe per value."""
    q = connection.ops.quote_name
    table, column = q(table), q(column)
    sql = (
        f"WITH RECURSIVE found(name, n) AS (SELECT MIN({column}), 1 FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > found.name), n + 1 "
        "FROM found WHERE found.name IS NOT NULL AND n < %s) "
        "SELECT name FROM found WHERE name IS NOT NULL"
    )
    with read_connection().cursor() as cursor:  # the replica inside on_replica
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


def queue_names(limit: int = MAX_SERIES_ROWS) -> list[str]:
    """Every queue named by a job, a batch message or a Queue row, sorted, at most ``limit``."""
    names = set(_distinct(Job._meta.db_table, Job._meta.get_field("queue").column, limit))
    message = BatchMessage._meta
    names |= set(_distinct(message.db_table, message.get_field("queue").column, limit))
    names |= set(Queue.objects.values_list("name", flat=True)[:limit])
    return sorted(names)[:limit]


def _kinds(names: Sequence[str]) -> dict[str, str]:
    stored = dict(Queue.objects.filter(name__in=list(names)).values_list("name", "kind"))
    return {name: stored.get(name) or Queue.default_kind(name) for name in names}


# --- gauges -------------------------------------------------------------------------


def _capped_counts(names: Sequence[str], cap: int) -> dict[tuple[str, str], int]:
    """Jobs per (queue, state), each counted to at most ``cap + 1`` rows on the (queue, status)
    index, a few dozen queues per statement."""
    table = connection.ops.quote_name(Job._meta.db_table)
    out: dict[tuple[str, str], int] = {}
    for start in range(0, len(names), QUEUES_PER_STATEMENT):
        parts, params = [], []
        for name in names[start : start + QUEUES_PER_STATEMENT]:
            for state in STATES:
                parts.append(
                    f"SELECT %s, %s, (SELECT COUNT(*) FROM (SELECT 1 FROM {table} "
                    "WHERE queue = %s AND status = %s LIMIT %s) AS t)"
                )
                params += [name, state, name, state, cap + 1]
        if not parts:
            continue
        with read_connection().cursor() as cursor:  # the replica inside on_replica
            cursor.execute(" UNION ALL ".join(parts), params)
            for name, state, n in cursor.fetchall():
                out[(name, state)] = int(n)
    return out


def jobs_by_state(names: Sequence[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_jobs",
        f"Jobs by queue and state: exact up to COUNT_CAP ({int(knob('COUNT_CAP'))}) per series, "
        "past it PostgreSQL's planner estimate.",
        labels=["queue", "status"],
    )
    cap = int(knob("COUNT_CAP"))
    counts = _capped_counts(names, cap)
    postgres = dialect().postgres
    for name in names:
        for state in STATES:
            n = counts.get((name, state), 0)
            if n > cap:
                qs: QuerySet[Job] = Job.objects.filter(queue=name, status=state)
                if postgres:
                    n = max(planner_estimate(qs) or 0, cap)
                else:  # SQLite: the covering (queue, status) index, counted through
                    n = qs.order_by().count()
            family.add_metric([name, state], n)
    return family


def _oldest_run_after(name: str) -> datetime | None:
    """The earliest ``run_after`` of a queue's queued jobs: one descent of the claim index
    (queue, priority DESC, run_after) per priority in use, found by a loose scan."""
    q = connection.ops.quote_name
    table = q(Job._meta.db_table)
    # The literal matches the partial index's predicate (a parameter would not, on SQLite).
    queued = f"status = '{QUEUED}' AND queue = %s"
    sql = (
        f"WITH RECURSIVE lanes(p) AS (SELECT MAX(priority) FROM {table} WHERE {queued} "
        f"UNION ALL SELECT (SELECT MAX(priority) FROM {table} "
        f"WHERE {queued} AND priority < lanes.p) "
        "FROM lanes WHERE lanes.p IS NOT NULL) "
        f"SELECT MIN((SELECT MIN(run_after) FROM {table} WHERE {queued} AND priority = lanes.p)) "
        "FROM lanes WHERE lanes.p IS NOT NULL"
    )
    with read_connection().cursor() as cursor:  # the replica inside on_replica
        cursor.execute(sql, [name, name, name])
        row = cursor.fetchone()
    return dialect().read_ts(row[0]) if row else None


def oldest_ready_age(names: Sequence[str], now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_queue_oldest_queued_age_seconds",
        "Seconds the longest-waiting ready job of the queue has been ready (0 when none waits; "
        "jobs scheduled for later do not wait yet).",
        labels=["queue"],
    )
    kinds = _kinds(names)
    for name in names:
        if kinds[name] == QueueKind.BATCH:
            continue
        oldest = _oldest_run_after(name)
        age = (now - oldest).total_seconds() if oldest is not None and oldest <= now else 0.0
        family.add_metric([name], round(max(age, 0.0), 3))
    return family


def workers_alive(names: Sequence[str], now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_workers_alive",
        "Workers (local and remote) serving the queue whose heartbeat is fresher than "
        "WORKER_TIMEOUT_SECONDS.",
        labels=["queue"],
    )
    fresh = now - timedelta(seconds=float(knob("WORKER_TIMEOUT_SECONDS")))
    per_queue: Counter[str] = Counter()
    rows = Worker.objects.filter(last_heartbeat__gte=fresh).values_list("queues", flat=True)
    for queues in rows[: MAX_SERIES_ROWS * 10]:
        per_queue.update(set(queues or ()))
    for name in sorted(set(names) | set(per_queue))[:MAX_SERIES_ROWS]:
        family.add_metric([name], per_queue.get(name, 0))
    return family


def _capped(qs: QuerySet[Any], cap: int) -> int:
    return qs.order_by()[: cap + 1].count()


def batch_messages(names: Sequence[str], now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_batch_messages",
        "Messages of batch queues by state (each counted to COUNT_CAP): waiting (visible, "
        "deliveries left), in_flight (held by a consumer or backing off), dead (every delivery "
        "spent).",
        labels=["queue", "state"],
    )
    cap = int(knob("COUNT_CAP"))
    kinds = _kinds(names)
    for name in names:
        if kinds[name] != QueueKind.BATCH:
            continue
        messages = BatchMessage.objects.filter(queue=name)
        visible = messages.filter(visible_after__lte=now)
        counts = {
            "waiting": _capped(visible.filter(attempts__lt=F("max_attempts")), cap),
            "in_flight": _capped(messages.filter(visible_after__gt=now), cap),
            "dead": _capped(visible.filter(attempts__gte=F("max_attempts")), cap),
        }
        for state in BATCH_STATES:
            family.add_metric([name, state], counts[state])
    return family


def schedule_lag(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_schedule_lag_seconds",
        "Seconds a live schedule's next fire time is overdue (0 when it is not due yet).",
        labels=["schedule"],
    )
    rows = (
        Schedule.objects.filter(paused=False)
        .order_by("name")
        .values_list("name", "next_fire_at")[:MAX_SERIES_ROWS]
    )
    for name, next_fire_at in rows:
        lag = (now - next_fire_at).total_seconds() if next_fire_at is not None else 0.0
        family.add_metric([name], round(max(lag, 0.0), 3))
    return family


def held_back_keys() -> Iterator[GaugeMetricFamily]:
    """Ready jobs flow keys hold back, and the keys holding them, per queue and key *family*.

    By family (``account`` for ``account:42``), never by key: a family is
    named in code or by an operator, a key by each tenant, so the series stay
    as few as the families whatever the tenants do. Which keys they are is the
    queues page's (``jobs.selectors.flow_keys.held_back``).
    """
    jobs = GaugeMetricFamily(
        f"{PREFIX}_key_held_back_jobs",
        "Ready jobs of the queue held back by a flow key of the family at its concurrency "
        "limit or out of tokens (a job held by keys of two families counts in each; the "
        "scan stops at COUNT_CAP jobs per queue).",
        labels=["queue", "family"],
    )
    keys = GaugeMetricFamily(
        f"{PREFIX}_keys_at_limit",
        "Flow keys of the family at their concurrency limit or out of tokens that hold back "
        "ready jobs of the queue.",
        labels=["queue", "family"],
    )
    found = held_back_by_family()
    for (queue, family), (held, count) in sorted(found.items())[:MAX_SERIES_ROWS]:
        jobs.add_metric([queue, family], held)
        keys.add_metric([queue, family], count)
    yield jobs
    yield keys


# --- from the rollup ----------------------------------------------------------------


def rollup_totals() -> Iterator[Metric]:
    """Counters and histograms from the all-time sums per queue and operation."""
    labels = ["queue", "operation"]
    counters = {
        name: CounterMetricFamily(f"{PREFIX}_jobs_{name}", text, labels=labels)
        for name, text in COUNTER_HELP.items()
    }
    lease = CounterMetricFamily(
        f"{PREFIX}_lease_expiries",
        "Runs whose lease expired (worker dead or silent), requeued or failed.",
        labels=labels,
    )
    rescues = CounterMetricFamily(
        f"{PREFIX}_reaper_rescues",
        "Jobs the reaper took back from workers: lease expiries and timeouts it enforced.",
        labels=labels,
    )
    wait = HistogramMetricFamily(
        f"{PREFIX}_job_wait_seconds",
        "Seconds from ready (enqueued, retry due, requeued) to started, per run.",
        labels=labels,
    )
    run = HistogramMetricFamily(
        f"{PREFIX}_job_run_seconds",
        "Seconds from started to the end of the run (success, failure, retry, timeout).",
        labels=labels,
    )
    for total in MetricTotal.objects.order_by("queue", "operation")[:MAX_SERIES_ROWS]:
        key = [total.queue, total.operation]
        for name, family in counters.items():
            family.add_metric(key, getattr(total, name))
        lease.add_metric(key, total.lease_expiries)
        rescues.add_metric(key, total.rescues)
        wait.add_metric(key, buckets.cumulative(total.wait_bucket_counts), total.wait_sum)
        run.add_metric(key, buckets.cumulative(total.run_bucket_counts), total.run_sum)
    yield from counters.values()
    yield from (lease, rescues, wait, run)


def rollup_age(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        f"{PREFIX}_metrics_rollup_age_seconds",
        "Seconds since a reaper last rolled up events (the counters lag by this much plus "
        "METRICS_SETTLE_SECONDS); absent until the first rollup.",
    )
    at = (
        MetricCursor.objects.filter(name=EVENTS_CURSOR)
        .values_list("rolled_up_at", flat=True)
        .first()
    )
    if at is not None:
        family.add_metric([], round(max((now - at).total_seconds(), 0.0), 3))
    return family
