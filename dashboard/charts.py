"""Geometry of the metrics charts, drawn by the server as inline SVG (no chart library).

``metric_charts`` turns a ``jobs.metrics.series.Series`` into four charts
(throughput, failure rate, wait time p50/p95, run time p50/p95);
``queue_sparks`` draws the queue page's small throughput and failure rate
charts. Everything here is numbers and plain text: the templates
(``dashboard/_charts.html``) escape every label, queue and operation name,
and colours come from the theme's CSS variables, so a chart follows light
and dark.

A line breaks where a bucket has no value (no job finished, no run
observed) instead of drawing a misleading zero; every value has a dot with
a ``<title>`` tooltip, and the page repeats the figures in a table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jobs.metrics.series import Point, Series, Window

WIDTH, HEIGHT = 640, 190
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 24
SPARK_WIDTH, SPARK_HEIGHT = 220, 40

# Time-axis label formats per window (UTC).
X_FORMATS = {"1h": "%H:%M", "24h": "%H:%M", "7d": "%a %d", "30d": "%b %d"}
# Tick steps for a seconds axis: round numbers of milliseconds, seconds, minutes and hours.
SECOND_STEPS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.2, 0.25, 0.5,
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
)  # fmt: skip
PERCENT_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.25)
TICKS = 4
# Past this many buckets a chart's dots are drawn only under the pointer.
DENSE_POINTS = 96


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class XLabel:
    x: float
    label: str
    anchor: str  # "start", "middle" or "end"


@dataclass(frozen=True)
class Dot:
    x: float
    y: float
    title: str


@dataclass(frozen=True)
class Line:
    """One drawn series: its path (broken at missing values), dots and legend label."""

    key: str  # CSS class suffix: mc-line-<key>
    label: str
    path: str
    dots: list[Dot]
    area: str = ""  # filled path down to the axis (throughput)


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str  # what a value is, e.g. "jobs finished per 15 min"
    summary: str  # the SVG's accessible name: what it shows over the window
    lines: list[Line]
    y_ticks: list[Tick]
    x_labels: list[XLabel]
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    points: int = 0

    @property
    def dense(self) -> bool:
        """Too many buckets for visible dots: they show on hover only."""
        return self.points > DENSE_POINTS


@dataclass(frozen=True)
class Spark:
    """A queue page chart: no axes, a peak label and a tooltip per bucket."""

    key: str
    label: str  # accessible name
    line: Line
    peak: str
    width: int = SPARK_WIDTH
    height: int = SPARK_HEIGHT


# --- formatting -------------------------------------------------------------------


def seconds_text(value: float | None) -> str:
    """``0``, ``750 ms``, ``4.2 s``, ``2.5 min``, ``1.5 h``; ``—`` for no value."""
    if value is None:
        return "—"
    if value <= 0:
        return "0"
    if value < 1:
        return f"{_g(value * 1000)} ms"
    if value < 60:
        return f"{_g(value)} s"
    if value < 3600:
        return f"{_g(value / 60)} min"
    return f"{_g(value / 3600)} h"


def percent_text(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{_g(value * 100)}%"


def count_text(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _g(value: float) -> str:
    """Two significant decimals at most, no trailing zeros: ``4.2``, ``120``, ``0.25``."""
    text = f"{value:.3g}" if value < 100 else f"{value:.0f}"
    return text if "e" not in text else f"{value:.0f}"


# --- scales -----------------------------------------------------------------------


def nice_max(peak: float, steps: Sequence[float] | None = None) -> tuple[float, float]:
    """``(top, step)``: the smallest round step whose ``TICKS`` multiples reach ``peak``."""
    if peak <= 0:
        first = steps[0] if steps else 1.0
        return first * TICKS, first
    if steps is None:  # counts: 1, 2, 2.5, 5 times a power of ten, whole numbers
        magnitude = 10 ** math.floor(math.log10(peak / TICKS)) if peak >= TICKS else 1
        steps = [max(m * magnitude, 1) for m in (1, 2, 2.5, 5, 10)]
        steps = [s for s in steps if float(s).is_integer()] or [1]
    for step in steps:
        if step * TICKS >= peak:
            return step * math.ceil(peak / step), step
    step = steps[-1]
    return step * math.ceil(peak / step), step


class _Frame:
    """Maps bucket indexes and values to SVG coordinates inside the plot area."""

    def __init__(self, n: int, top_value: float, *, width: int, height: int, box: tuple) -> None:
        self.n = max(n, 1)
        self.top_value = top_value or 1.0
        self.left, self.right, self.top, self.bottom = box
        self.width, self.height = width, height

    def x(self, i: int) -> float:
        return round(self.left + (i + 0.5) * (self.right - self.left) / self.n, 2)

    def y(self, value: float) -> float:
        share = min(max(value / self.top_value, 0.0), 1.0)
        return round(self.bottom - share * (self.bottom - self.top), 2)


def _path(frame: _Frame, values: Sequence[float | None]) -> str:
    """``M … L …`` through the defined values, a new ``M`` after each gap; a value alone
    between gaps gets a zero-length ``h0``, which the round line cap draws as a dot."""
    parts: list[str] = []
    run = 0  # values in the current segment
    for i, value in enumerate(values):
        if value is None:
            if run == 1:
                parts.append("h0")
            run = 0
            continue
        parts.append(f"{'L' if run else 'M'}{frame.x(i)} {frame.y(value)}")
        run += 1
    if run == 1:
        parts.append("h0")
    return " ".join(parts)


def _area(frame: _Frame, values: Sequence[float]) -> str:
    if not values:
        return ""
    inner = " ".join(f"L{frame.x(i)} {frame.y(v)}" for i, v in enumerate(values))
    return f"M{frame.x(0)} {frame.bottom} {inner} L{frame.x(len(values) - 1)} {frame.bottom} Z"


def _line(
    frame: _Frame,
    key: str,
    label: str,
    values: Sequence[float | None],
    titles: Sequence[str],
    *,
    area: bool = False,
) -> Line:
    dots = [Dot(frame.x(i), frame.y(v), titles[i]) for i, v in enumerate(values) if v is not None]
    filled = _area(frame, [v or 0.0 for v in values]) if area else ""
    return Line(key=key, label=label, path=_path(frame, values), dots=dots, area=filled)


def _x_labels(frame: _Frame, points: Sequence[Point], window: Window) -> list[XLabel]:
    if not points:
        return []
    fmt = X_FORMATS.get(window.key, "%H:%M")
    n = len(points)
    marks = [(0, "start"), (n // 4, "middle"), (n // 2, "middle"), (3 * n // 4, "middle")]
    labels = [XLabel(frame.x(i), points[i].start.strftime(fmt), anchor) for i, anchor in marks]
    labels.append(XLabel(frame.right, "now", "end"))
    return labels


def _y_ticks(frame: _Frame, top: float, step: float, text: Callable[[float], str]) -> list[Tick]:
    count = round(top / step) if step else 0
    return [Tick(frame.y(step * k), text(step * k)) for k in range(count + 1)]


# --- the charts ---------------------------------------------------------------------


def metric_charts(series: Series) -> list[Chart]:
    """Throughput, failure rate, wait p50/p95 and run p50/p95 over ``series``' window."""
    return [
        _throughput(series),
        _failure_rate(series),
        _latency(series, "wait", "Wait time", "from ready to started"),
        _latency(series, "run", "Run time", "from started to its end"),
    ]


def _frame(series: Series, top: float) -> _Frame:
    return _Frame(
        len(series.points),
        top,
        width=WIDTH,
        height=HEIGHT,
        box=(LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM),
    )


def _stamp(point: Point) -> str:
    return point.start.strftime("%Y-%m-%d %H:%M UTC")


def _throughput(series: Series) -> Chart:
    window, points = series.window, series.points
    top, step = nice_max(max((p.finished for p in points), default=0))
    frame = _frame(series, top)
    titles = [
        f"{_stamp(p)}: {p.finished:,} finished ({p.succeeded:,} succeeded, "
        f"{p.failed:,} failed), {p.started:,} started"
        for p in points
    ]
    failed_titles = [f"{_stamp(p)}: {p.failed:,} failed" for p in points]
    total = series.total
    return Chart(
        key="throughput",
        title="Throughput",
        unit=f"jobs finished per {window.step_label}",
        summary=(
            f"Jobs finished per {window.step_label} over the last {window.label}: "
            f"{total.succeeded:,} succeeded, {total.failed:,} failed"
        ),
        lines=[
            _line(frame, "finished", "finished", [p.finished for p in points], titles, area=True),
            _line(
                frame,
                "failed",
                "failed",
                [p.failed if p.failed else None for p in points],
                failed_titles,
            ),
        ],
        y_ticks=_y_ticks(frame, top, step, count_text),
        x_labels=_x_labels(frame, points, window),
        points=len(points),
    )


def _failure_rate(series: Series) -> Chart:
    window, points = series.window, series.points
    rates = [p.failure_rate for p in points]
    top, step = nice_max(max((r for r in rates if r is not None), default=0), PERCENT_STEPS)
    top, step = (1.0, 0.25) if top > 1 else (top, step)
    frame = _frame(series, top)
    titles = [
        f"{_stamp(p)}: {percent_text(p.failure_rate)} failed "
        f"({p.failed:,} of {p.finished:,} finished)"
        for p in points
    ]
    return Chart(
        key="failure-rate",
        title="Failure rate",
        unit="failed of finished",
        summary=(
            f"Share of finished jobs that failed per {window.step_label} over the last "
            f"{window.label}: {percent_text(series.total.failure_rate)} overall"
        ),
        lines=[_line(frame, "rate", "failure rate", rates, titles)],
        y_ticks=_y_ticks(frame, top, step, percent_text),
        x_labels=_x_labels(frame, points, window),
        points=len(points),
    )


def _latency(series: Series, name: str, title: str, what: str) -> Chart:
    window, points = series.window, series.points
    p50 = [getattr(p, f"{name}_p50") for p in points]
    p95 = [getattr(p, f"{name}_p95") for p in points]
    top, step = nice_max(max((v for v in (*p50, *p95) if v is not None), default=0), SECOND_STEPS)
    frame = _frame(series, top)
    lines = []
    for key, values in (("p50", p50), ("p95", p95)):
        titles = [
            f"{_stamp(p)}: {title.lower()} {key} {seconds_text(v)}"
            for p, v in zip(points, values, strict=True)
        ]
        lines.append(_line(frame, key, key, values, titles))
    total = series.total
    overall = (getattr(total, f"{name}_p50"), getattr(total, f"{name}_p95"))
    return Chart(
        key=name,
        title=f"{title} p50 / p95",
        unit=what,
        summary=(
            f"{title} per {window.step_label} over the last {window.label}, {what}: "
            f"p50 {seconds_text(overall[0])}, p95 {seconds_text(overall[1])} overall"
        ),
        lines=lines,
        y_ticks=_y_ticks(frame, top, step, seconds_text),
        x_labels=_x_labels(frame, points, window),
        points=len(points),
    )


def queue_sparks(series: Series) -> tuple[Spark, Spark]:
    """The queue page's pair for one queue: jobs finished, and the failure rate (drawn up
    to a round number past its worst bucket, said in its label).

    No dot per bucket (a hundred queues of 168 buckets would be thousands of
    elements): each chart has one tooltip, and the metrics page has the rest.
    """
    window, points = series.window, series.points
    box = (1, SPARK_WIDTH - 1, 3, SPARK_HEIGHT - 2)
    peak = max((p.finished for p in points), default=0)
    frame = _Frame(len(points), peak or 1, width=SPARK_WIDTH, height=SPARK_HEIGHT, box=box)
    finished = [p.finished for p in points]
    throughput = Spark(
        key="throughput",
        label=(
            f"Jobs of {series.queue} finished per {window.step_label} over the last "
            f"{window.label}: {series.total.finished:,} in all, at most {peak:,} per "
            f"{window.step_label}"
        ),
        line=Line("finished", "finished", _path(frame, finished), [], _area(frame, finished)),
        peak=f"peak {peak:,}",
    )
    rates = [p.failure_rate for p in points]
    worst = max((r for r in rates if r is not None), default=None)
    top, _ = nice_max(worst or 0, PERCENT_STEPS)
    top = min(top, 1.0)
    frame = _Frame(len(points), top, width=SPARK_WIDTH, height=SPARK_HEIGHT, box=box)
    failure = Spark(
        key="failure-rate",
        label=(
            f"Failure rate of {series.queue} per {window.step_label} over the last "
            f"{window.label} (drawn from 0 to {percent_text(top)}): "
            f"{percent_text(series.total.failure_rate)} overall, worst {percent_text(worst)}"
        ),
        line=Line("rate", "failure rate", _path(frame, rates), []),
        peak=f"worst {percent_text(worst)}",
    )
    return throughput, failure
