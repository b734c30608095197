"""The charts' reads of the rollup (jobs.metrics.series) and the quarter and hour rows
behind the longer windows (jobs.metrics.spans), on the real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.metrics import buckets
from jobs.metrics.rollup import roll_up_metrics
from jobs.metrics.series import metric_series, queue_series, series_names
from jobs.metrics.spans import (
    HOUR,
    QUARTER,
    floor_to,
    fold_metric_spans,
    folded_until,
    prune_metric_spans,
)
from jobs.models import Job, JobEvent, MetricRollup, MetricSpan
from tests.factories import failed, succeeded, unique_queue

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 4, 13, 37, 12, tzinfo=UTC)


def minute(at: datetime, queue: str = "q", operation: str = "op", **counts) -> MetricRollup:
    """A rollup row as the reaper writes it; ``wait``/``run`` are per-bucket count lists."""
    wait = counts.pop("wait", None) or buckets.empty()
    run = counts.pop("run", None) or buckets.empty()
    return MetricRollup.objects.create(
        minute=at.replace(second=0, microsecond=0),
        queue=queue,
        operation=operation,
        wait_bucket_counts=wait,
        run_bucket_counts=run,
        **counts,
    )


def slot(bound: float, n: int) -> list[int]:
    counts = buckets.empty()
    counts[buckets.BOUNDS.index(bound)] = n
    return counts


def test_minutes_are_summed_per_bucket_in_sql_and_empty_buckets_are_zero() -> None:
    # Two minutes of the same 15-minute bucket, one in another, one before the window.
    minute(NOW - timedelta(minutes=3), succeeded=4, failed=1, run=slot(0.25, 5))
    minute(NOW - timedelta(minutes=5), succeeded=2, run=slot(1.0, 2))
    minute(NOW - timedelta(hours=3), succeeded=7)
    minute(NOW - timedelta(hours=25), succeeded=100)
    series = metric_series(window="24h", now=NOW)
    assert len(series.points) == 96
    last = series.points[-1]
    assert last.start == datetime(2026, 3, 4, 13, 30, tzinfo=UTC)
    assert (last.succeeded, last.failed, last.finished) == (6, 1, 7)
    assert list(last.run_counts) == buckets.added(slot(0.25, 5), slot(1.0, 2))
    assert series.total.succeeded == 13
    assert sum(p.finished for p in series.points[:-1]) == 7
    assert [p.finished for p in series.points].count(0) == 94


def test_filters_narrow_to_one_queue_and_operation() -> None:
    at = NOW - timedelta(minutes=2)
    minute(at, "a", "x", succeeded=1)
    minute(at, "a", "y", succeeded=10)
    minute(at, "b", "x", succeeded=100)
    assert metric_series(window="1h", now=NOW).total.succeeded == 111
    assert metric_series(window="1h", queue="a", now=NOW).total.succeeded == 11
    assert metric_series(window="1h", operation="x", now=NOW).total.succeeded == 101
    assert metric_series(window="1h", queue="a", operation="x", now=NOW).total.succeeded == 1
    assert metric_series(window="1h", queue="nope", now=NOW).empty
    assert series_names() == ([], [])  # names come from the all-time totals


def test_percentiles_come_from_the_summed_histogram_of_a_bucket() -> None:
    at = NOW - timedelta(minutes=1)
    minute(at, "a", wait=slot(0.005, 90))
    minute(at, "b", wait=slot(2.5, 10))
    point = metric_series(window="1h", now=NOW).points[-2]
    assert point.wait_p50 == pytest.approx(0.005 * 50 / 90)
    assert point.wait_p95 == pytest.approx(1.0 + 1.5 * 5 / 10)
    assert point.run_p50 is None


def test_queue_series_is_one_grouped_query_for_every_queue() -> None:
    at = NOW - timedelta(minutes=20)
    for i in range(5):
        minute(at, f"queue-{i}", succeeded=i, failed=1)
    with CaptureQueriesContext(connection) as queries:
        series = queue_series(window="24h", now=NOW)
    minutes = f'"{MetricRollup._meta.db_table}"'
    assert len(queries) <= 2  # and where the folded quarters end
    assert sum(minutes in q["sql"] for q in queries.captured_queries) == 1
    assert [s.queue for s in series] == [f"queue-{i}" for i in range(5)]
    assert [s.total.finished for s in series] == [1, 2, 3, 4, 5]


def test_real_jobs_rolled_up_are_charted() -> None:
    queue = unique_queue()
    for _ in range(3):
        succeeded(queue=queue)
    failed(queue=queue)
    roll_up_metrics(settle_seconds=0)
    series = metric_series(window="1h", queue=queue)
    assert (series.total.started, series.total.succeeded, series.total.failed) == (4, 3, 1)
    assert series.total.failure_rate == 0.25
    assert series.total.wait_p50 is not None and series.total.run_p95 is not None


def _spread(now: datetime, hours: int) -> None:
    """Minute rows every 37 minutes over ``hours``, with both histograms."""
    for i in range(hours * 60 // 37):
        at = now - timedelta(minutes=37 * i + 1)
        minute(at, f"q{i % 3}", f"op{i % 2}", started=i, succeeded=i, failed=i % 4,
               wait=slot(0.1, i + 1), run=slot(buckets.BOUNDS[i % 18], 2))  # fmt: skip


def test_folded_spans_read_the_same_as_their_minutes() -> None:
    now = timezone.now()
    _spread(now, 72)
    keys = ("24h", "7d", "30d")
    before = {key: metric_series(window=key, now=now) for key in keys}
    queues_before = {key: queue_series(window=key, now=now) for key in keys}
    while fold_metric_spans(cutoff=now, read_upto=_last_event()):
        pass
    for span in (QUARTER, HOUR):  # up to the last span with a minute row, before now's
        assert floor_to(now, span) - timedelta(minutes=37) <= folded_until(span)
        assert folded_until(span) <= floor_to(now, span)
    spans = f'"{MetricSpan._meta.db_table}"'
    for key in keys:
        with CaptureQueriesContext(connection) as queries:
            got = metric_series(window=key, now=now)
        assert got.points == before[key].points
        assert any(spans in q["sql"] for q in queries.captured_queries)
        assert queue_series(window=key, now=now) == queues_before[key]


def test_a_span_is_folded_only_once_the_rollup_has_read_all_its_events() -> None:
    now = timezone.now()
    early, late = now - timedelta(hours=4), now - timedelta(hours=1, minutes=30)
    minute(early, succeeded=1)
    minute(late, succeeded=1)
    job = succeeded(queue=unique_queue())
    unread = JobEvent.objects.filter(job=job).order_by("id").first()
    JobEvent.objects.filter(pk=unread.pk).update(ts=now - timedelta(hours=2, minutes=10))
    # The rollup has read up to just before that event: spans from its time on wait.
    assert fold_metric_spans(cutoff=now, read_upto=unread.pk - 1) == 2  # a quarter, an hour
    assert folded_until(HOUR) == floor_to(early, HOUR) + timedelta(hours=1)
    assert folded_until(QUARTER) == floor_to(early, QUARTER) + timedelta(minutes=15)
    assert fold_metric_spans(cutoff=now, read_upto=unread.pk - 1) == 0
    assert fold_metric_spans(cutoff=now, read_upto=_last_event()) == 2
    assert folded_until(HOUR) == floor_to(late, HOUR) + timedelta(hours=1)
    assert MetricSpan.objects.count() == 4


def test_two_reapers_folding_the_same_spans_write_each_row_once(monkeypatch) -> None:
    now = timezone.now()
    minute(now - timedelta(hours=5), "a", succeeded=3)
    minute(now - timedelta(hours=5), "b", succeeded=3)
    assert fold_metric_spans(cutoff=now, read_upto=_last_event()) == 4
    # A second reaper that read the watermark before the first one committed.
    monkeypatch.setattr("jobs.metrics.spans.folded_until", lambda span: None)
    assert fold_metric_spans(cutoff=now, read_upto=_last_event()) == 4
    assert MetricSpan.objects.count() == 4
    assert set(MetricSpan.objects.values_list("succeeded", flat=True)) == {3}


def test_old_spans_are_pruned() -> None:
    now = timezone.now()
    minute(now - timedelta(days=40), succeeded=1)
    minute(now - timedelta(days=2), succeeded=1)
    while fold_metric_spans(cutoff=now, read_upto=_last_event()):
        pass
    assert MetricSpan.objects.count() == 4
    assert prune_metric_spans(cutoff=now - timedelta(days=30)) == 2
    assert MetricSpan.objects.filter(start__gt=now - timedelta(days=3)).count() == 2
    assert MetricSpan.objects.count() == 2


def _last_event() -> int:
    return JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def test_charts_never_read_the_jobs_or_events_tables() -> None:
    now = timezone.now()
    _spread(now, 30)
    fold_metric_spans(cutoff=now, read_upto=_last_event())
    tables = (Job._meta.db_table, JobEvent._meta.db_table)
    with CaptureQueriesContext(connection) as queries:
        for key in ("1h", "24h", "7d", "30d"):
            metric_series(window=key, queue="q1", now=now)
            queue_series(window=key, now=now)
    for query in queries.captured_queries:
        assert not any(f'"{table}"' in query["sql"] for table in tables), query["sql"]
