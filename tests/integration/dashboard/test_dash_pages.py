"""Every page and fragment renders real data, and job data never becomes markup."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from dashboard import render, selectors
from dashboard.detail import job_detail
from jobs.models import JobEvent
from jobs.transitions import emit_event
from tests.factories import (
    ECHO,
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    cancelled,
    failed,
    queued,
    running,
    succeeded,
    tick,
    worker,
)

HOSTILE = {"note": HOSTILE_SCRIPT, "img": HOSTILE_IMG, HOSTILE_IMG: "key too"}


def assert_inert(html: str) -> None:
    """No hostile markup survived as markup; it is all there as escaped text."""
    assert "<script>window.__pwned" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html or "&lt;img src=x" in html


@pytest.fixture
def hostile_jobs(db):
    job, held = running(ECHO, HOSTILE)
    emit_event(
        job.pk,
        event="note.added",
        message=HOSTILE_IMG,
        fields={"html": HOSTILE_SCRIPT},
        lease_token=held.lease_token,
    )
    dead = failed(ECHO, HOSTILE, code=HOSTILE_IMG, message=HOSTILE_SCRIPT)
    return job, dead


def test_job_page_shows_everything_and_escapes_it(operator_client: Client, hostile_jobs) -> None:
    job, dead = hostile_jobs
    for target in (job, dead):
        html = operator_client.get(f"/dashboard/jobs/{target.pk}/").content.decode()
        assert_inert(html)
        assert "&quot;note&quot;" in html  # pretty JSON, escaped
    html = operator_client.get(f"/dashboard/jobs/{dead.pk}/").content.decode()
    assert "&lt;img src=x onerror=&quot;window.__pwned=2&quot;&gt;" in html  # the error class


@pytest.mark.parametrize(
    "path", ["/dashboard/", "/dashboard/jobs/", "/dashboard/workers/", "/dashboard/queues/"]
)
def test_summary_pages_escape_job_data(operator_client: Client, hostile_jobs, path: str) -> None:
    html = operator_client.get(path).content.decode()
    assert "<script>window.__pwned" not in html and "<img src=x" not in html


def test_live_fragments_escape_job_data(hostile_jobs) -> None:
    job, dead = hostile_jobs
    detail = job_detail(job.pk)
    events = list(JobEvent.objects.filter(job=job).order_by("seq"))
    html = render.job_live(detail, "operator", events)
    assert_inert(html)
    assert 'hx-swap-oob="beforeend:#timeline"' in html
    rows = render.rows_oob(selectors.job_rows([dead.pk]), "operator")
    assert "<img src=x" not in rows and "&lt;img src=x" in rows
    for page in ("overview", "workers", "queues"):
        assert "<img src=x" not in render.page_live(page, "viewer")


def test_job_page_timing_progress_lease_and_worker(operator_client: Client) -> None:
    job, held = running(ECHO, {"account": 1})
    tick(job, held, 2, 5, "two of five")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    assert 'data-countdown="' in html  # the lease countdown
    assert "2 / 5" in html and '<progress max="100" value="40.0"' in html
    assert "Estimated finish" in html
    assert "worker-a.example" in html
    assert html.count('class="ev ') == 3  # enqueued, started, tick
    assert re.search(r'data-seq="3"', html)


def test_job_page_links_parent_and_children(operator_client: Client) -> None:
    parent = queued()
    child_a = queued(parent=parent.pk, queue=parent.queue)
    cancelled(parent=parent.pk, queue=parent.queue)
    html = operator_client.get(f"/dashboard/jobs/{parent.pk}/").content.decode()
    assert f"/dashboard/jobs/{child_a.pk}/" in html
    assert "Children" in html and "cancelled" in html
    child_html = operator_client.get(f"/dashboard/jobs/{child_a.pk}/").content.decode()
    assert f'href="/dashboard/jobs/{parent.pk}/"' in child_html


def test_unknown_job_is_404(operator_client: Client) -> None:
    assert (
        operator_client.get("/dashboard/jobs/00000000-0000-0000-0000-000000000000/").status_code
        == 404
    )


def test_job_live_endpoint_sends_only_new_events(operator_client: Client) -> None:
    job, held = running()
    last = tick(job, held, 1, 3, "first")
    tick(job, held, 2, 3, "second")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/live/?after={last}").content.decode()
    assert "second" in html and "first" not in html
    assert 'id="job-head" class="job-head" data-live-hold hx-swap-oob="true"' in html
    assert (
        operator_client.get(f"/dashboard/jobs/{job.pk}/live/?after={last}")["Cache-Control"]
        == "no-store"
    )


def test_earlier_events_load_on_demand(operator_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("DASHBOARD_TIMELINE_PAGE", "3")
    job, held = running()
    for i in range(1, 6):
        tick(job, held, i, 5, f"tick {i}")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    assert html.count('class="ev ') == 3 and "Show earlier events" in html
    earlier = operator_client.get(f"/dashboard/jobs/{job.pk}/earlier/?before=5").content.decode()
    assert 'hx-swap-oob="afterbegin:#timeline"' in earlier
    assert "tick 2" in earlier and "tick 3" not in earlier


def test_overview_counts_chart_and_failures(operator_client: Client) -> None:
    w = worker()
    succeeded(queue="alpha", worker_id=w.pk)
    # Messages alike but for a number: one failure, counted twice.
    failed(queue="alpha", code="TimeoutError", message="upstream took 31 s", worker_id=w.pk)
    failed(queue="alpha", code="TimeoutError", message="upstream took 45 s", worker_id=w.pk)
    queued(queue="alpha")
    worker(stale=True, hostname="old-box")
    response = operator_client.get("/dashboard/")
    html = response.content.decode()
    assert "alpha" in html and "TimeoutError" in html and "2×" in html
    assert '<svg class="chart"' in html and 'class="bar-fail"' in html
    ctx = response.context
    assert ctx["workers_alive"] == 1 and ctx["workers_stale"] == 1
    assert ctx["totals"]["failed"] == 2 and ctx["chart"]["failed"] == 2


def test_overview_live_fragment(operator_client: Client) -> None:
    queued(queue="beta")
    html = operator_client.get("/dashboard/?live=1").content.decode()
    assert html.startswith('\n<div id="page-body"') or 'id="page-body"' in html
    assert 'hx-swap-oob="true"' in html and "beta" in html
    assert "<html" not in html


def test_workers_page_flags_stale_workers_and_orphans(operator_client: Client) -> None:
    alive = worker(hostname="alive-box")
    dead = worker(stale=True, hostname="dead-box")
    mine, _ = running(worker_id=alive.pk)
    orphan, _ = running(worker_id=dead.pk)
    response = operator_client.get("/dashboard/workers/")
    html = response.content.decode()
    assert "alive-box" in html and "dead-box" in html and "stale" in html
    assert [j.pk for j in response.context["orphans"]] == [orphan.pk]
    assert f"/dashboard/jobs/{orphan.pk}/requeue/" in html
    assert f"/dashboard/jobs/{mine.pk}/requeue/" not in html


def test_queues_page_shows_settings_and_reclaims(operator_client: Client) -> None:
    from jobs.rescues import requeue_expired_leases

    job, _ = running(queue="gamma")
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import Job

    Job.objects.filter(pk=job.pk).update(leased_until=timezone.now() - timedelta(seconds=5))
    requeue_expired_leases(max_requeues=3)
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert "gamma" in html and "job.lease_expired_requeue" in html
    assert response_has_count(html, "leases requeued", 1)


def response_has_count(html: str, label: str, n: int) -> bool:
    return re.search(rf"{label} <strong>{n}</strong>", html) is not None
