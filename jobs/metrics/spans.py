"""Quarter-hour and hourly sums of the per-minute rollup, so that charts of a day or more
read a few rows per bucket instead of every minute.

A 24 hour chart over the minutes sums 1,440 rows per queue and operation,
a 30 day one 43,200 (a million rows for two dozen pairs: seconds of work).
Once a quarter of an hour or an hour is final, the rollup (``roll_up_metrics``)
copies the sum of its minutes into one ``MetricSpan`` row per queue and
operation; the charts (``jobs.metrics.series``) read spans up to the newest
folded one and minutes after it.

A span is final when nothing can still be added to its minutes: it ended
``METRICS_SETTLE_SECONDS`` ago and the rollup has read every event written
in it (the first event past the rollup's watermark is younger than its
end). Spans are folded in order, at most ``FOLD_SECONDS`` of them per call
and span length, skipping stretches without a minute row, and each call's
rows are written in one transaction. Several reapers may fold at once: a
final span sums to the same rows whoever folds it, and a row already there
is left alone.

Where the spans of a length stop: after the newest row of that length
(``folded_until``). Spans between it and now with no activity have no row
and read as empty minutes. An event counted after its span was folded (the
rollup's rare out-of-order commits) shows in the 1 hour chart only.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Max

from jobs.metrics.grouping import bucket_start, counts_of, epoch_bucket, histogram_of, sums
from jobs.models import JobEvent, MetricRollup, MetricSpan

QUARTER = 900
HOUR = 3600
SPANS = (QUARTER, HOUR)
# Time folded per call and span length at most (its minutes are summed in one query).
FOLD_SECONDS = 24 * HOUR
COUNTERS = ("started", "succeeded", "failed", "retried", "cancelled", "lease_expiries", "rescues")


def floor_to(at: datetime, seconds: int) -> datetime:
    """``at`` rounded down to a whole number of ``seconds`` since the epoch."""
    return datetime.fromtimestamp(int(at.timestamp()) // seconds * seconds, UTC)


def folded_until(span: int) -> datetime | None:
    """Every span of ``span`` seconds before this has its rows (None: none folded yet)."""
    newest = MetricSpan.objects.filter(span_seconds=span).aggregate(newest=Max("start"))["newest"]
    return datetime.fromtimestamp(int(newest.timestamp()) + span, UTC) if newest else None


def settled_before(*, cutoff: datetime, read_upto: int) -> datetime:
    """No minute before this will change: not later than ``cutoff`` (now less the settle
    time) nor the oldest event the rollup has not read (past id ``read_upto``)."""
    unread = (
        JobEvent.objects.filter(id__gt=read_upto)
        .order_by("id")
        .values_list("ts", flat=True)
        .first()
    )
    return min(cutoff, unread) if unread is not None else cutoff


def fold_metric_spans(*, cutoff: datetime, read_upto: int) -> int:
    """Fold the next final quarters and hours not folded yet; return the rows written."""
    settled = settled_before(cutoff=cutoff, read_upto=read_upto)
    return sum(fold_span(span, end=floor_to(settled, span)) for span in SPANS)


def fold_span(span: int, *, end: datetime, limit_seconds: int = FOLD_SECONDS) -> int:
    """Sum the minutes of the spans of ``span`` seconds after the newest folded one and
    before ``end`` (at most ``limit_seconds`` of them) into ``MetricSpan`` rows."""
    since = folded_until(span)
    minutes = MetricRollup.objects.order_by("minute")
    if since is not None:
        minutes = minutes.filter(minute__gte=since)
    first = minutes.values_list("minute", flat=True).first()
    if first is None or first >= end:
        return 0
    start = floor_to(first, span)
    stop = min(datetime.fromtimestamp(int(start.timestamp()) + limit_seconds, UTC), end)
    grouped = (
        MetricRollup.objects.filter(minute__gte=start, minute__lt=stop)
        .order_by()
        .annotate(bucket=epoch_bucket("minute", span))
        .values("bucket", "queue", "operation")
        .annotate(**sums(COUNTERS, seconds=True))
    )
    rows = [
        MetricSpan(
            span_seconds=span,
            start=bucket_start(row["bucket"], span),
            queue=row["queue"],
            operation=row["operation"],
            **counts_of(row, COUNTERS),
            wait_bucket_counts=histogram_of(row, "wait"),
            wait_sum=float(row["wait_sum"] or 0.0),
            run_bucket_counts=histogram_of(row, "run"),
            run_sum=float(row["run_sum"] or 0.0),
        )
        for row in grouped
    ]
    with transaction.atomic():
        MetricSpan.objects.bulk_create(rows, batch_size=500, ignore_conflicts=True)
    return len(rows)


def prune_metric_spans(*, cutoff: datetime, limit: int = 1000, rounds: int = 10) -> int:
    """Delete span rows that ended before ``cutoff`` (the minutes' retention), in rounds."""
    deleted = 0
    for span in SPANS:
        older = {"span_seconds": span, "start__lt": floor_to(cutoff, span)}
        for _ in range(rounds):
            ids = list(
                MetricSpan.objects.filter(**older)
                .order_by("start")
                .values_list("pk", flat=True)[:limit]
            )
            if not ids:
                break
            n, _ = MetricSpan.objects.filter(pk__in=ids, **older).delete()
            deleted += n
            if len(ids) < limit:
                break
    return deleted
