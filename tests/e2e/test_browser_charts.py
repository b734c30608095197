"""The metrics charts in a real browser: drawn as SVG with a dot and a tooltip
per value, switched between windows and filtered by queue, themed in light and dark,
and the queue page's small charts per queue."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs.metrics import buckets
from jobs.metrics.rollup import roll_up_metrics
from jobs.models import MetricRollup, MetricTotal
from tests.factories import HOSTILE_SCRIPT, failed, succeeded

pytestmark = pytest.mark.e2e


def slot(bound: float, n: int) -> list[int]:
    counts = buckets.empty()
    counts[buckets.BOUNDS.index(bound)] = n
    return counts


def history() -> None:
    """Real jobs rolled up by the reaper's function, then three days of older minutes."""
    for _ in range(4):
        succeeded(queue="emails", operation="dash.echo")
    failed(queue="emails", operation="dash.echo")
    succeeded(queue="reports", operation="dash.echo")
    roll_up_metrics(settle_seconds=0)
    now = timezone.now().replace(second=0, microsecond=0)
    MetricRollup.objects.bulk_create(
        MetricRollup(
            minute=now - timedelta(minutes=m),
            queue=queue,
            operation="dash.echo",
            started=10,
            succeeded=9 if queue == "emails" else 10,
            failed=1 if queue == "emails" else 0,
            wait_bucket_counts=slot(0.1, 8),
            run_bucket_counts=slot(2.5, 10),
        )
        for m in range(90, 3 * 24 * 60, 45)
        for queue in ("emails", "reports", HOSTILE_SCRIPT)
    )
    MetricTotal.objects.get_or_create(queue=HOSTILE_SCRIPT, operation="dash.echo")


def test_the_metrics_page_draws_charts_and_switches_windows(open_page) -> None:
    history()
    page = open_page("viewer")
    page.goto("/dashboard/")
    page.get_by_role("link", name="Metrics", exact=True).click()
    expect(page).to_have_url(re.compile(r"/dashboard/metrics/$"))
    charts = page.locator("#metric-charts figure.metric-chart")
    expect(charts).to_have_count(4)

    page.get_by_role("link", name="1 h", exact=True).click()
    expect(page).to_have_url(re.compile(r"\?window=1h$"))
    throughput = page.locator("#chart-throughput svg")
    expect(throughput).to_have_attribute("aria-label", re.compile(r"5 succeeded, 1 failed"))
    # A dot per minute, each with its tooltip; the real jobs' minute(s) hold all six.
    dots = page.locator("#chart-throughput .mc-finished circle.mc-dot")
    expect(dots).to_have_count(60)
    titles = dots.locator("title").all_text_contents()
    assert sum(int(re.search(r": (\d+) finished", t).group(1)) for t in titles) == 6
    assert throughput.bounding_box()["height"] > 100
    # The failure rate has values only where jobs finished: 1 of 6 failed.
    expect(page.locator("#chart-failure-rate svg")).to_have_attribute(
        "aria-label", re.compile(r"16\.7% overall")
    )
    assert page.locator("#chart-failure-rate circle.mc-dot").count() in (1, 2)

    page.get_by_role("link", name="7 d", exact=True).click()
    expect(page).to_have_url(re.compile(r"\?window=7d$"))
    expect(page.locator("#metric-charts")).to_have_attribute("data-window", "7d")
    expect(page.locator("#chart-numbers tbody tr")).to_have_count(168)
    for key in ("throughput", "failure-rate", "wait", "run"):
        chart = page.locator(f"#chart-{key} svg")
        expect(chart).to_be_visible()
        assert chart.locator("circle.mc-dot").count() > 50, key
        path = chart.locator("path.mc-line").first.get_attribute("d")
        assert path and path.startswith("M") and path.count("L") > 10, key
    expect(page.locator("#chart-run .mc-p95 circle.mc-dot title").first).to_contain_text(
        re.compile(r"run time p95 \d")
    )
    # The theme's colours, not the browser's black default.
    stroke = page.eval_on_selector(
        "#chart-throughput .mc-finished path.mc-line", "p => getComputedStyle(p).stroke"
    )
    assert stroke not in ("none", "rgb(0, 0, 0)"), stroke

    # A queue from the select; the window stays.
    page.locator("select[name=queue]").select_option("reports")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(r"\?window=7d&queue=reports$"))
    expect(page.locator("#chart-failure-rate svg")).to_have_attribute(
        "aria-label", re.compile(r"0% overall")
    )
    page.get_by_role("link", name="30 d", exact=True).click()
    expect(page).to_have_url(re.compile(r"\?window=30d&queue=reports$"))
    expect(page.locator("#chart-numbers tbody tr")).to_have_count(120)

    # A hostile queue name is text in the select and in the charts.
    page.locator("select[name=queue]").select_option(HOSTILE_SCRIPT)
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#metric-charts figure")).to_have_count(4)
    assert page.evaluate("window.__pwned") is None


def test_dark_theme_charts_use_the_dark_palette(open_page) -> None:
    history()
    strokes = {}
    for scheme in ("light", "dark"):
        page = open_page("viewer", color_scheme=scheme)
        page.goto("/dashboard/metrics/?window=24h")
        expect(page.locator("#chart-throughput circle.mc-dot").first).to_be_attached()
        strokes[scheme] = page.eval_on_selector(
            "#chart-failure-rate path.mc-line", "p => getComputedStyle(p).stroke"
        )
    assert strokes["light"] != strokes["dark"], strokes


def test_the_queue_page_charts_every_queue(open_page) -> None:
    history()
    page = open_page("operator")
    page.goto("/dashboard/queues/")
    card = page.locator("#queue-charts")
    expect(card.locator("tbody tr")).to_have_count(3)
    row = card.locator('tr[data-queue="emails"]')
    expect(row.locator("svg.mc-spark")).to_have_count(2)
    expect(row.locator("svg.mc-spark-throughput path.mc-area")).to_have_count(1)
    expect(row.locator("svg.mc-spark-failure-rate")).to_have_attribute(
        "aria-label", re.compile(r"Failure rate of emails")
    )
    card.get_by_role("link", name="1 h", exact=True).click()
    expect(page).to_have_url(re.compile(r"\?window=1h#queue-charts$"))
    expect(card.locator("tbody tr")).to_have_count(2)  # the older minutes are out of the hour
    card.get_by_role("link", name="Charts of queue emails").click()
    expect(page).to_have_url(re.compile(r"/dashboard/metrics/\?window=1h&queue=emails$"))
    expect(page.locator("#metric-charts figure")).to_have_count(4)
