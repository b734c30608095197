"""The arithmetic behind the metrics charts: percentiles from histogram buckets, round
axis ticks, broken lines and the windows' buckets (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboard.charts import _Frame, _path, nice_max, percent_text, seconds_text
from jobs.metrics import buckets
from jobs.metrics.series import WINDOWS, Point, percentile, window_of


def histogram(**by_bound: int) -> list[int]:
    """Counts per bucket from ``{"le_0_25": 10, "inf": 2}``-style keywords."""
    counts = buckets.empty()
    for key, n in by_bound.items():
        if key == "inf":
            counts[-1] += n
        else:
            counts[buckets.BOUNDS.index(float(key[3:].replace("_", ".")))] += n
    return counts


def test_a_percentile_interpolates_linearly_inside_its_bucket() -> None:
    # Ten observations in (0.1, 0.25]: the median is halfway through the bucket.
    counts = histogram(le_0_25=10)
    assert percentile(counts, 0.5) == pytest.approx(0.175)
    assert percentile(counts, 0.95) == pytest.approx(0.1 + 0.15 * 0.95)


def test_a_percentile_finds_the_bucket_holding_its_rank() -> None:
    # 90 fast (<= 5 ms) and 10 slow in (1, 2.5]: p50 is fast, p95 is half into the slow bucket.
    counts = histogram(le_0_005=90, le_2_5=10)
    assert percentile(counts, 0.5) == pytest.approx(0.005 * 50 / 90)
    assert percentile(counts, 0.95) == pytest.approx(1.0 + 1.5 * 5 / 10)


def test_the_first_bucket_starts_at_zero_and_the_overflow_reads_as_the_last_bound() -> None:
    assert percentile(histogram(le_0_005=4), 0.5) == pytest.approx(0.0025)
    assert percentile(histogram(inf=3), 0.5) == buckets.BOUNDS[-1]


def test_an_empty_histogram_has_no_percentile() -> None:
    assert percentile(buckets.empty(), 0.5) is None
    assert percentile((), 0.95) is None
    assert Point(start=datetime.now(UTC)).wait_p95 is None


def test_failure_rate_is_failed_over_finished() -> None:
    point = Point(start=datetime.now(UTC), succeeded=3, failed=1, cancelled=5)
    assert point.failure_rate == 0.25
    assert Point(start=datetime.now(UTC), cancelled=2).failure_rate is None


@pytest.mark.parametrize(
    ("key", "points", "step"),
    [("1h", 60, 60), ("24h", 96, 900), ("7d", 168, 3600), ("30d", 120, 21600)],
)
def test_each_window_has_a_bounded_number_of_aligned_buckets(
    key: str, points: int, step: int
) -> None:
    window = WINDOWS[key]
    assert window.points == points <= 200
    now = datetime(2026, 3, 4, 13, 37, 12, tzinfo=UTC)
    start, end = window.bounds(now)
    assert end - start == window.span
    assert start < now < end and end - now <= timedelta(seconds=step)
    assert int(start.timestamp()) % step == 0


def test_an_unknown_window_is_the_default() -> None:
    assert window_of("forever") is window_of(None) is WINDOWS["24h"]


@pytest.mark.parametrize(
    ("peak", "steps", "top", "step"),
    [
        (0, None, 4, 1),
        (3, None, 3, 1),
        (37, None, 40, 10),
        (1000, None, 1000, 250),
        (0.15, (0.05, 0.1), 0.15, 0.05),
        (7, (1, 2, 5), 8, 2),
    ],
)
def test_axis_tops_are_round(peak: float, steps, top: float, step: float) -> None:
    assert nice_max(peak, steps) == (pytest.approx(top), step)


def test_a_line_breaks_where_a_bucket_has_no_value() -> None:
    frame = _Frame(4, 1.0, width=100, height=100, box=(0, 100, 0, 100))
    path = _path(frame, [1.0, 0.5, None, 0.0])
    assert path == "M12.5 0.0 L37.5 50.0 M87.5 100.0 h0"


def test_labels() -> None:
    assert [seconds_text(v) for v in (None, 0, 0.25, 4.2, 150, 5400)] == [
        "—",
        "0",
        "250 ms",
        "4.2 s",
        "2.5 min",
        "1.5 h",
    ]
    assert percent_text(0.125) == "12.5%"
    assert percent_text(None) == "—"
