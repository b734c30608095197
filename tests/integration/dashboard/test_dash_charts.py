"""The metrics page and the queue page's charts: windows, filters,
percentiles from known histograms, the empty state, hostile names, and reads that
touch only the rollup whatever the size of the jobs and events tables."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.metrics import buckets
from jobs.metrics.rollup import roll_up_metrics
from jobs.metrics.spans import fold_metric_spans
from jobs.models import Job, JobEvent, MetricCursor, MetricRollup, MetricSpan, MetricTotal
from tests.factories import (
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    failed,
    succeeded,
    unique_queue,
)

pytestmark = pytest.mark.django_db

METRICS = "/dashboard/metrics/"
QUEUES = "/dashboard/queues/"
CHARTS = ("throughput", "failure-rate", "wait", "run")


def slot(bound: float, n: int) -> list[int]:
    counts = buckets.empty()
    counts[buckets.BOUNDS.index(bound)] = n
    return counts


def rolled(ago: timedelta, queue: str = "emails", operation: str = "emails.send", **counts):
    """A rollup minute as the reaper writes it, and its queue and operation's all-time row."""
    wait = counts.pop("wait", None) or buckets.empty()
    run = counts.pop("run", None) or buckets.empty()
    at = (timezone.now() - ago).replace(second=0, microsecond=0)
    MetricTotal.objects.get_or_create(queue=queue, operation=operation)
    return MetricRollup.objects.create(
        minute=at,
        queue=queue,
        operation=operation,
        wait_bucket_counts=wait,
        run_bucket_counts=run,
        **counts,
    )


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def stat(html: str, label: str) -> str:
    match = re.search(
        rf'<span class="stat-label">{re.escape(label)}</span><span class="stat-value">([^<]*)<',
        html,
    )
    assert match, f"no {label} stat"
    return match.group(1)


def bucket_rows(html: str) -> int:
    table = html.split('id="chart-numbers"', 1)[1].split("</table>", 1)[0]
    return table.count("<tr>") - 1  # less the header


@pytest.mark.parametrize(
    ("window", "buckets_"), [("1h", 60), ("24h", 96), ("7d", 168), ("30d", 120)]
)
def test_each_window_draws_four_charts_over_its_buckets(
    viewer_client: Client, window: str, buckets_: int
) -> None:
    rolled(timedelta(minutes=5), succeeded=9, failed=1, wait=slot(0.1, 10), run=slot(1.0, 10))
    html = page(viewer_client, f"{METRICS}?window={window}")
    assert re.findall(r'data-chart="([^"]+)"', html) == list(CHARTS)
    assert f'aria-current="page" href="{METRICS}?window={window}"' in html
    assert bucket_rows(html) == buckets_
    assert stat(html, "Finished") == "10"
    assert stat(html, "Failure rate") == "10%"
    assert html.count('<circle class="mc-dot"') >= 4  # a dot per value: one bucket, 5 lines


def test_the_window_picks_which_rows_count(viewer_client: Client) -> None:
    rolled(timedelta(minutes=10), succeeded=1)
    rolled(timedelta(hours=3), succeeded=10)
    rolled(timedelta(days=3), succeeded=100)
    rolled(timedelta(days=20), succeeded=1000)
    totals = {
        key: stat(page(viewer_client, f"{METRICS}?window={key}"), "Finished")
        for key in ("1h", "24h", "7d", "30d")
    }
    assert totals == {"1h": "1", "24h": "11", "7d": "111", "30d": "1,111"}


def test_queue_and_operation_filters(viewer_client: Client) -> None:
    rolled(timedelta(minutes=3), "emails", "emails.send", succeeded=1)
    rolled(timedelta(minutes=3), "emails", "emails.digest", succeeded=10)
    rolled(timedelta(minutes=3), "reports", "emails.send", succeeded=100)
    finished = {
        query: stat(page(viewer_client, f"{METRICS}?window=1h&{query}"), "Finished")
        for query in (
            "",
            "queue=emails",
            "operation=emails.send",
            "queue=emails&operation=emails.send",
        )
    }
    assert finished == {
        "": "111",
        "queue=emails": "11",
        "operation=emails.send": "101",
        "queue=emails&operation=emails.send": "1",
    }
    html = page(viewer_client, f"{METRICS}?window=7d&queue=emails")
    assert '<option value="emails" selected>' in html
    assert '<option value="reports">' in html
    # The window links keep the filter.
    assert f'href="{METRICS}?window=30d&amp;queue=emails"' in html


def test_percentiles_are_read_from_the_histogram_buckets(viewer_client: Client) -> None:
    # Waits: 90 at most 5 ms, 10 in (1 s, 2.5 s]. Runs: 10 in (0.1 s, 0.25 s].
    rolled(timedelta(minutes=2), "a", wait=slot(0.005, 90), run=slot(0.25, 10), succeeded=10)
    rolled(timedelta(minutes=2), "b", wait=slot(2.5, 10))
    html = page(viewer_client, f"{METRICS}?window=1h")
    # p50: rank 50 of 90 in (0, 5 ms] -> 2.78 ms; p95: rank 5 of 10 in (1, 2.5] -> 1.75 s.
    assert stat(html, "Wait p50 / p95") == "2.78 ms / 1.75 s"
    # p50: rank 5 of 10 in (0.1, 0.25] -> 175 ms; p95: rank 9.5 -> 242.5 ms.
    assert stat(html, "Run p50 / p95") in ("175 ms / 242 ms", "175 ms / 243 ms")
    assert "wait time p95 1.75 s" in html  # a point's tooltip


def test_real_jobs_rolled_up_by_the_reaper_are_charted(viewer_client: Client) -> None:
    queue = unique_queue()
    for _ in range(3):
        succeeded(queue=queue)
    failed(queue=queue)
    roll_up_metrics(settle_seconds=0)
    html = page(viewer_client, f"{METRICS}?window=1h&queue={queue}")
    assert stat(html, "Finished") == "4"
    assert stat(html, "Failure rate") == "25%"
    assert "rolled up" in html
    queues = page(viewer_client, QUEUES)
    assert f'<tr data-queue="{queue}">' in queues


def test_nothing_to_chart_says_so(viewer_client: Client) -> None:
    html = page(viewer_client, METRICS)
    assert 'id="metric-charts-empty"' in html
    assert "No reaper has rolled up metrics yet" in html
    assert '<svg class="mc-svg' not in html
    roll_up_metrics(settle_seconds=0)
    html = page(viewer_client, f"{METRICS}?queue=nothing-here")
    assert "Nothing to chart in the last 24 hours" in html
    assert "No job started, finished" in html
    queues = page(viewer_client, QUEUES)
    assert 'id="queue-charts"' in queues
    assert "No job of any queue finished in the last 24 hours" in queues


def test_hostile_queue_and_operation_names_are_escaped(viewer_client: Client) -> None:
    rolled(timedelta(minutes=4), HOSTILE_SCRIPT, HOSTILE_IMG, succeeded=2, failed=1)
    from urllib.parse import quote

    for url in (
        f"{METRICS}?window=1h",
        f"{METRICS}?window=1h&queue={quote(HOSTILE_SCRIPT)}&operation={quote(HOSTILE_IMG)}",
        f"{QUEUES}?window=1h",
    ):
        html = page(viewer_client, url)
        assert HOSTILE_SCRIPT not in html and HOSTILE_IMG not in html, url
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html, url
    html = page(viewer_client, f"{METRICS}?window=1h&queue={quote(HOSTILE_SCRIPT)}")
    assert stat(html, "Finished") == "3"


def test_unreadable_choices_are_reported_and_not_applied(viewer_client: Client) -> None:
    rolled(timedelta(minutes=4), succeeded=5)
    html = page(viewer_client, f"{METRICS}?window=forever&queue=%00&operation={'x' * 201}")
    assert "There is no window of that name" in html
    assert "This queue contains a NUL character" in html
    assert "This operation is longer than any operation name" in html
    assert f'aria-current="page" href="{METRICS}?window=24h"' in html
    assert stat(html, "Finished") == "5"


def test_the_queue_page_charts_each_queue_from_one_grouped_query(viewer_client: Client) -> None:
    for i in range(6):
        rolled(timedelta(minutes=30), f"queue-{i}", succeeded=i + 1, failed=1)
    html = page(viewer_client, f"{QUEUES}?window=7d")
    rows = re.findall(r'<tr data-queue="(queue-\d)">', html)
    assert rows == [f"queue-{i}" for i in range(6)]
    assert html.count('class="mc-spark mc-spark-throughput"') == 6
    assert html.count('class="mc-spark mc-spark-failure-rate"') == 6
    assert f'aria-current="page" href="{QUEUES}?window=7d#queue-charts"' in html
    assert f'href="{METRICS}?window=7d&amp;queue=queue-3"' in html
    with CaptureQueriesContext(connection) as queries:
        page(viewer_client, f"{QUEUES}?window=24h")
    rollup = MetricRollup._meta.db_table
    assert sum(f'"{rollup}"' in q["sql"] for q in queries.captured_queries) == 1


def _many_rows(queues: range) -> None:
    """Three days of minute rows, one every 97 minutes, for each of ``queues``."""
    now = timezone.now().replace(second=0, microsecond=0)
    MetricRollup.objects.bulk_create(
        MetricRollup(
            minute=now - timedelta(minutes=m + 1),
            queue=f"queue-{q}",
            operation=f"op-{q % 3}",
            succeeded=1,
            wait_bucket_counts=slot(0.1, 1),
            run_bucket_counts=slot(1.0, 1),
        )
        for q in queues
        for m in range(0, 3 * 24 * 60, 97)
    )


@pytest.mark.parametrize("window", ["1h", "24h", "7d", "30d"])
def test_pages_read_only_the_rollup_in_a_bounded_number_of_queries(
    viewer_client: Client, window: str
) -> None:
    succeeded(queue="busy")  # a job and its events, which no chart may read
    page(viewer_client, f"{METRICS}?window={window}")  # warm the session and caches

    def queries(url: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            page(viewer_client, url)
        return [q["sql"] for q in captured.captured_queries]

    _many_rows(range(1))
    small = queries(f"{METRICS}?window={window}&queue=queue-0")
    small_queues = queries(f"{QUEUES}?window={window}")
    _many_rows(range(1, 9))
    fold_metric_spans(cutoff=timezone.now(), read_upto=_last_event())
    big = queries(f"{METRICS}?window={window}&queue=queue-0")
    big_queues = queries(f"{QUEUES}?window={window}")
    # Session, user and permissions, the statement timeout (PostgreSQL), then the reads:
    # at most the newest folded span, spans, minutes, the filter's names and the watermark.
    assert len(big) <= 20
    metric = [m._meta.db_table for m in (MetricRollup, MetricSpan, MetricTotal, MetricCursor)]
    assert sum(any(f'"{table}"' in sql for table in metric) for sql in big) <= 5
    assert len(big) - len(small) <= 1  # at most the read of the folded spans is added
    assert len(big_queues) - len(small_queues) <= 1
    jobs, events = f'"{Job._meta.db_table}"', f'"{JobEvent._meta.db_table}"'
    for sql in big:
        assert jobs not in sql and events not in sql, sql
    if window != "1h":
        assert any(f'"{MetricSpan._meta.db_table}"' in sql for sql in big)


def _last_event() -> int:
    return JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


def test_every_role_that_may_view_sees_the_page_and_the_nav_link(
    viewer_client: Client, operator_client: Client, nobody_client: Client
) -> None:
    for client in (viewer_client, operator_client):
        html = page(client, METRICS)
        assert f'<a href="{METRICS}" aria-current="page">Metrics</a>' in html
    assert nobody_client.get(METRICS).status_code == 403
    assert Client().get(METRICS).status_code == 302
