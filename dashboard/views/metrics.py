"""The metrics page (charts of the rollup per window, queue and operation) and the
queue page's per-queue charts.

Both read only the rollup (``jobs.metrics.series``): a bounded number of
queries whatever the size of the jobs and events tables. The URL holds the
choice (``?window=24h&queue=…&operation=…``) so a view can be shared; a
value that cannot be used is reported on the page and not applied, as on
the job list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse

from dashboard.charts import metric_charts, percent_text, queue_sparks, seconds_text
from dashboard.inputs import text_problem
from dashboard.views.common import base_context, page
from jobs.metrics.rollup import EVENTS_CURSOR
from jobs.metrics.series import (
    DEFAULT_WINDOW,
    WINDOWS,
    Window,
    metric_series,
    queue_series,
    series_names,
    window_of,
)
from jobs.models import MetricCursor

# Longest queue or operation name the rollup stores (its columns' max_length).
MAX_NAME = 200
TAB_LABELS = {"1h": "1 h", "24h": "24 h", "7d": "7 d", "30d": "30 d"}


@dataclass(frozen=True)
class ChartChoice:
    """What the metrics page shows: a window, optionally one queue and/or operation."""

    window: Window
    queue: str | None = None
    operation: str | None = None
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_query(cls, query: QueryDict) -> ChartChoice:
        errors: dict[str, str] = {}
        key = query.get("window") or DEFAULT_WINDOW
        if key not in WINDOWS:
            errors["window"] = (
                f"There is no window of that name; choose one of {', '.join(WINDOWS)}."
            )
        names: dict[str, str | None] = {}
        for name in ("queue", "operation"):
            value = query.get(name) or None
            problem = text_problem(value) if value is not None else None
            if problem is None and value is not None and len(value) > MAX_NAME:
                problem = f"is longer than any {name} name ({MAX_NAME} characters)"
            if problem is not None:
                errors[name] = f"This {name} {problem}; it was not applied."
                value = None
            names[name] = value
        return cls(window=window_of(key), errors=errors, **names)

    def query(self, **changes: str | None) -> str:
        """This choice's query string, with ``changes`` applied (None drops a key)."""
        values = {"window": self.window.key, "queue": self.queue, "operation": self.operation}
        values.update(changes)
        return urlencode({k: v for k, v in values.items() if v})


def window_tabs(current: Window, href: Any) -> list[tuple[str, str, bool]]:
    """``(label, url, current)`` per window; ``href(key)`` makes each link."""
    return [(TAB_LABELS.get(key, key), href(key), key == current.key) for key in WINDOWS]


@page
def metrics(request: HttpRequest) -> HttpResponse:
    choice = ChartChoice.from_query(request.GET)
    series = metric_series(window=choice.window, queue=choice.queue, operation=choice.operation)
    queue_names, operation_names = series_names()
    base = reverse("dashboard:metrics")
    total = series.total
    context = {
        **base_context(request, "metrics"),
        "choice": choice,
        "series": series,
        "charts": [] if series.empty else metric_charts(series),
        "tabs": window_tabs(choice.window, lambda key: f"{base}?{choice.query(window=key)}"),
        "queue_names": queue_names,
        "operation_names": operation_names,
        "rolled_up_at": MetricCursor.objects.filter(name=EVENTS_CURSOR)
        .values_list("rolled_up_at", flat=True)
        .first(),
        "stats": [
            ("Finished", f"{total.finished:,}", f"{total.succeeded:,} succeeded"),
            ("Failure rate", percent_text(total.failure_rate), f"{total.failed:,} failed"),
            ("Wait p50 / p95", _pair(total.wait_p50, total.wait_p95), "ready to started"),
            ("Run p50 / p95", _pair(total.run_p50, total.run_p95), "started to end"),
            ("Retried", f"{total.retried:,}", f"{total.cancelled:,} cancelled"),
        ],
        "rows": [
            {
                "point": p,
                "rate": percent_text(p.failure_rate),
                "wait": (seconds_text(p.wait_p50), seconds_text(p.wait_p95)),
                "run": (seconds_text(p.run_p50), seconds_text(p.run_p95)),
            }
            for p in series.points
        ],
    }
    return render(request, "dashboard/metrics.html", context)


def _pair(p50: float | None, p95: float | None) -> str:
    return f"{seconds_text(p50)} / {seconds_text(p95)}"


def queue_charts_context(request: HttpRequest) -> dict[str, Any]:
    """The queue page's "Throughput by queue" card: every queue's pair of small charts
    for the window in ``?window=``, from one grouped query."""
    key = request.GET.get("window")
    window = window_of(key)
    queues_url = reverse("dashboard:queues")
    metrics_url = reverse("dashboard:metrics")
    rows = []
    for series in queue_series(window=window):
        throughput, failure = queue_sparks(series)
        rows.append(
            {
                "series": series,
                "throughput": throughput,
                "failure": failure,
                "rate": percent_text(series.total.failure_rate),
                "url": f"{metrics_url}?{urlencode({'window': window.key, 'queue': series.queue})}",
            }
        )
    return {
        "queue_charts": {
            "window": window,
            "rows": rows,
            "tabs": window_tabs(window, lambda k: f"{queues_url}?window={k}#queue-charts"),
            "metrics_url": f"{metrics_url}?window={window.key}",
        }
    }
