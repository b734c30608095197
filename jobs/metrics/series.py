"""Time series for the dashboard's charts, read from the rollup only (never jobs or events).

A chart covers a window (``WINDOWS``: 1 h, 24 h, 7 d, 30 d) cut into at
most 168 buckets of a fixed step (1 min, 15 min, 1 h, 6 h), aligned on
whole steps since the Unix epoch (UTC), the last bucket being the one now
is in. The database sums each bucket (``jobs.metrics.grouping``: counters
and every histogram bucket, grouped by ``floor(epoch / step)``) and returns
one row per bucket:

- 1 h reads ``MetricRollup``: a range of its unique (minute, queue,
  operation) index, at most 60 rows per queue and operation;
- 24 h, 7 d and 30 d read ``MetricSpan`` rows (``jobs.metrics.spans``) of
  the longest span that divides their step (quarters for 24 h, hours for 7
  and 30 d) up to the newest folded one, then the minutes after it: at most
  96, 168 or 720 span rows per queue and operation, plus the last quarter or
  hour of minutes.

So a chart costs the same at ten million events as at ten, and a queue or
operation filter narrows the same index range.

Percentiles are estimated from the summed histogram (``jobs.metrics.buckets``)
as Prometheus' ``histogram_quantile`` does: find the bucket holding the
observation of rank ``q * count`` and interpolate linearly between the
bucket's lower and upper bound by how far into the bucket that rank falls
(the first bucket starts at 0). That assumes observations spread evenly
inside a bucket, so an estimate is off by at most the bucket's width (a p95
between 10 s and 30 s reads somewhere in that range); a rank past the last
bound (an hour) reads as that bound.

The rollup lags the jobs by the reaper's interval plus ``METRICS_SETTLE_SECONDS``,
so the newest bucket is usually incomplete.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from jobs.metrics import buckets
from jobs.metrics.grouping import counts_of, epoch_bucket, histogram_of, sums
from jobs.metrics.spans import SPANS, folded_until
from jobs.models import MetricRollup, MetricSpan, MetricTotal

COUNTS = ("started", "succeeded", "failed", "retried", "cancelled")
# Names offered by the dashboard's queue and operation selects.
MAX_NAMES = 1000
# Queues the queue page draws a chart for.
MAX_QUEUES = 100
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """A chart's time range and the width of one of its buckets."""

    key: str
    label: str
    span: timedelta
    step: timedelta
    step_label: str  # "per <step_label>"

    @property
    def points(self) -> int:
        return int(self.span / self.step)

    @property
    def step_seconds(self) -> int:
        return int(self.step.total_seconds())

    @property
    def folded_span(self) -> int | None:
        """The longest folded span its buckets are made of (``jobs.metrics.spans``), if any."""
        fits = [span for span in SPANS if self.step_seconds % span == 0]
        return max(fits) if fits else None

    def bounds(self, now: datetime) -> tuple[datetime, datetime]:
        """``[start, end)``: ``points`` whole steps, the last holding ``now``."""
        step = self.step_seconds
        end = datetime.fromtimestamp((int(now.timestamp()) // step + 1) * step, UTC)
        return end - self.span, end


WINDOWS: dict[str, Window] = {
    w.key: w
    for w in (
        Window("1h", "1 hour", timedelta(hours=1), timedelta(minutes=1), "minute"),
        Window("24h", "24 hours", timedelta(hours=24), timedelta(minutes=15), "15 min"),
        Window("7d", "7 days", timedelta(days=7), timedelta(hours=1), "hour"),
        Window("30d", "30 days", timedelta(days=30), timedelta(hours=6), "6 h"),
    )
}
DEFAULT_WINDOW = "24h"


def window_of(key: str | None) -> Window:
    """The window named ``key``, or the default one for a missing or unknown name."""
    return WINDOWS.get(key or "", WINDOWS[DEFAULT_WINDOW])


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a histogram's per-bucket counts, interpolated inside
    its bucket; None when the histogram is empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    running = 0
    for i, n in enumerate(counts[: buckets.SLOTS]):
        if n and running + n >= rank:
            if i >= len(buckets.BOUNDS):
                return buckets.BOUNDS[-1]  # past the last bound: no upper end to go to
            lower = buckets.BOUNDS[i - 1] if i else 0.0
            return lower + (buckets.BOUNDS[i] - lower) * max(rank - running, 0) / n
        running += n
    return buckets.BOUNDS[-1]


@dataclass(frozen=True)
class Point:
    """One bucket of a series: counts, and the wait and run time histograms summed."""

    start: datetime
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    wait_counts: tuple[int, ...] = ()
    run_counts: tuple[int, ...] = ()

    @cached_property
    def finished(self) -> int:
        return self.succeeded + self.failed

    @cached_property
    def failure_rate(self) -> float | None:
        """Failed over finished (0..1); None when nothing finished."""
        return self.failed / self.finished if self.finished else None

    @cached_property
    def wait_p50(self) -> float | None:
        return percentile(self.wait_counts, 0.5)

    @cached_property
    def wait_p95(self) -> float | None:
        return percentile(self.wait_counts, 0.95)

    @cached_property
    def run_p50(self) -> float | None:
        return percentile(self.run_counts, 0.5)

    @cached_property
    def run_p95(self) -> float | None:
        return percentile(self.run_counts, 0.95)

    def plus(self, other: Point) -> Point:
        return replace(
            self,
            **{name: getattr(self, name) + getattr(other, name) for name in COUNTS},
            wait_counts=_added((self.wait_counts, other.wait_counts)),
            run_counts=_added((self.run_counts, other.run_counts)),
        )


@dataclass(frozen=True)
class Series:
    """One point per bucket of ``window`` (empty buckets included), oldest first."""

    window: Window
    start: datetime
    end: datetime
    points: list[Point]
    queue: str | None = None
    operation: str | None = None
    total: Point = field(init=False)

    def __post_init__(self) -> None:
        total = Point(start=self.start)
        for point in self.points:
            total = total.plus(point)
        object.__setattr__(self, "total", total)

    @property
    def empty(self) -> bool:
        """Nothing at all was rolled up in the window."""
        total = self.total
        return not (
            any(getattr(total, name) for name in COUNTS)
            or any(total.wait_counts)
            or any(total.run_counts)
        )


def metric_series(
    *,
    window: Window | str | None = None,
    queue: str | None = None,
    operation: str | None = None,
    now: datetime | None = None,
) -> Series:
    """Counts and latency histograms per bucket of ``window``, optionally of one queue
    and/or operation (one query on minutes; two more on folded spans past 1 h)."""
    window = window if isinstance(window, Window) else window_of(window)
    start, end = window.bounds(now or timezone.now())
    found: dict[int, Point] = {}
    for rows in _ranges(window, start, end, queue=queue, operation=operation):
        for row in rows.values("bucket").annotate(**sums(COUNTS)):
            _add(found, row["bucket"], _point(row))
    return Series(
        window=window,
        start=start,
        end=end,
        points=_filled(window, start, found),
        queue=queue,
        operation=operation,
    )


def queue_series(
    *, window: Window | str | None = None, now: datetime | None = None
) -> list[Series]:
    """Started, succeeded and failed per bucket for each queue seen in the window (at most
    ``MAX_QUEUES``, by name), all queues in one grouped query (per tier), no histograms."""
    window = window if isinstance(window, Window) else window_of(window)
    start, end = window.bounds(now or timezone.now())
    by_queue: dict[str, dict[int, Point]] = {}
    for rows in _ranges(window, start, end):
        for row in rows.values("queue", "bucket").annotate(**sums(COUNTS, histograms=False)):
            _add(by_queue.setdefault(row["queue"], {}), row["bucket"], _point(row))
    return [
        Series(
            window=window,
            start=start,
            end=end,
            points=_filled(window, start, by_queue[name]),
            queue=name,
        )
        for name in sorted(by_queue)[:MAX_QUEUES]
    ]


def series_names() -> tuple[list[str], list[str]]:
    """The queue and operation names the rollup has ever counted, for the filters.

    Read from the all-time sums (one row per queue and operation), never from
    the minutes.
    """
    pairs = list(MetricTotal.objects.order_by().values_list("queue", "operation")[:MAX_NAMES])
    return sorted({q for q, _ in pairs}), sorted({o for _, o in pairs})


def _ranges(
    window: Window,
    start: datetime,
    end: datetime,
    *,
    queue: str | None = None,
    operation: str | None = None,
) -> list[QuerySet[Any]]:
    """The row ranges that make up ``[start, end)``, each annotated with its ``bucket``:
    folded spans first (where the window's step is made of them), then minutes."""
    ranges: list[QuerySet[Any]] = []
    since = start
    if window.folded_span is not None:
        folded = folded_until(window.folded_span)
        if folded is not None and folded > start:
            since = min(folded, end)
            spans = MetricSpan.objects.filter(
                span_seconds=window.folded_span, start__gte=start, start__lt=since
            )
            ranges.append(_narrowed(spans, "start", window, queue, operation))
    if since < end:
        minutes = MetricRollup.objects.filter(minute__gte=since, minute__lt=end)
        ranges.append(_narrowed(minutes, "minute", window, queue, operation))
    return ranges


def _narrowed(
    rows: QuerySet[Any], column: str, window: Window, queue: str | None, operation: str | None
) -> QuerySet[Any]:
    if queue is not None:
        rows = rows.filter(queue=queue)
    if operation is not None:
        rows = rows.filter(operation=operation)
    return rows.order_by().annotate(bucket=epoch_bucket(column, window.step_seconds))


def _point(row: dict[str, Any]) -> Point:
    """A grouped row's sums as a point (its ``start`` is set by ``_filled``); histograms
    the query did not sum read as zeros."""
    return Point(
        start=EPOCH,
        **counts_of(row, COUNTS),
        wait_counts=tuple(histogram_of(row, "wait")),
        run_counts=tuple(histogram_of(row, "run")),
    )


def _add(found: dict[int, Point], bucket: int, point: Point) -> None:
    found[bucket] = found[bucket].plus(point) if bucket in found else point


def _filled(window: Window, start: datetime, found: dict[int, Point]) -> list[Point]:
    """One point per bucket from ``start``, zeros where the rollup had no row."""
    first = int(start.timestamp()) // window.step_seconds
    points = []
    for i in range(window.points):
        at = start + i * window.step
        point = found.get(first + i)
        points.append(replace(point, start=at) if point else Point(start=at))
    return points


def _added(arrays: Iterable[Sequence[int]]) -> tuple[int, ...]:
    total = buckets.empty()
    for counts in arrays:
        total = buckets.added(total, counts)
    return tuple(total)
