"""The dashboard's workflow pages: the list, a workflow's graph (drawn or counted), its
live updates, cancel and retry from the page, the job list's workflow filter and a
step's dependencies on its job page. Both databases."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import time
import uuid
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from dashboard.consumers import DashboardConsumer
from dashboard.relay import relay
from django_controlplane.testing import drain_jobs
from jobs.models import Job, OperatorAction, Workflow
from jobs.operations import operation
from jobs.workflows import workflow
from tests.factories import HOSTILE_IMG, HOSTILE_SCRIPT, make_user

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "dash_wf.add"
BOOM = "dash_wf.boom"


@operation(ADD, payload_schema={"type": "object"})
def add(ctx, payload):
    return payload.get("n", 0) + sum(ctx.dependency_results().values())


@operation(BOOM, payload_schema={"type": "object"})
def boom(ctx, payload):
    raise RuntimeError("boom")


def diamond(name: str = "diamond", *, queue: str = "wfdash", on_failure: str = "cancel"):
    """a -> (b, c) -> d, with ``c`` failing when ``fail`` (see callers)."""
    flow = workflow(name, on_failure=on_failure)
    a = flow.step(ADD, {"n": 1}, name="a", queue=queue)
    b = flow.step(ADD, {"n": 2}, name="b", depends_on=[a], queue=queue)
    c = flow.step(ADD, {"n": 3}, name="c", depends_on=[a], queue=queue)
    flow.step(ADD, {"n": 4}, name="d", depends_on=[b, c], queue=queue)
    return flow.enqueue()


def step(run: Workflow, name: str) -> Job:
    return Job.objects.get(workflow=run, step=name)


def html(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# --- the list ----------------------------------------------------------------------------


def test_the_list_shows_workflows_newest_first_with_counts_and_filters_by_status(
    viewer_client: Client,
) -> None:
    first = diamond("first")
    second = diamond("second")
    Workflow.objects.filter(pk=first.pk).update(status="failed")
    page = html(viewer_client.get(reverse("dashboard:workflows")))
    assert 'href="/dashboard/workflows/" aria-current="page"' in page  # the nav link
    assert page.index('wf-name">second') < page.index('wf-name">first')
    assert f"?workflow={second.pk}&amp;status=queued" in page
    assert ">queued 4</a>" in page
    failed = html(viewer_client.get(reverse("dashboard:workflows"), {"status": "failed"}))
    assert "first" in failed and f"workflow-{second.pk}" not in failed
    unknown = html(viewer_client.get(reverse("dashboard:workflows"), {"status": "nope"}))
    assert "first" in unknown and "second" in unknown  # an unknown status is not applied


def test_the_list_pages_by_cursor(viewer_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("DASHBOARD_PAGE_SIZE", "2")
    runs = [diamond(f"run-{i}") for i in range(3)]
    page = html(viewer_client.get(reverse("dashboard:workflows")))
    assert "run-2" in page and "run-1" in page and "run-0" not in page
    older = re.search(r'href="\?before=([^"]+)" rel="next"', page).group(1)
    rest = html(viewer_client.get(reverse("dashboard:workflows"), {"before": older}))
    assert "run-0" in rest and "run-2" not in rest
    bad = html(viewer_client.get(reverse("dashboard:workflows"), {"before": "garbage"}))
    assert "no longer valid" in bad and runs[2].name in bad


# --- one workflow -------------------------------------------------------------------------


def test_the_workflow_page_draws_steps_in_columns_by_depth(viewer_client: Client) -> None:
    run = diamond()
    page = html(viewer_client.get(reverse("dashboard:workflow", args=[run.pk])))
    columns = re.findall(r'<div class="wf-column" data-depth="(\d+)">', page)
    assert columns == ["0", "1", "2"]
    depth_of = {}
    for depth, body in re.findall(
        r'data-depth="(\d+)">(.*?)(?=<div class="wf-column"|</section>)', page, re.S
    ):
        for name in re.findall(r'<span class="step-name">([^<]+)</span>', body):
            depth_of[name] = int(depth)
    assert depth_of == {"a": 0, "b": 1, "c": 1, "d": 2}
    d = step(run, "d")
    assert f'id="step-{d.pk}"' in page and f'href="/dashboard/jobs/{d.pk}/"' in page
    assert re.search(
        r'after <span class="step-ref">b</span>, <span class="step-ref">c</span>', page
    )
    assert "waiting" in page and ADD in page
    assert "Cancel workflow" not in page  # a viewer gets no controls


def test_the_page_follows_the_run_and_shows_the_result(operator_client: Client) -> None:
    run = diamond()
    drain_jobs(queues=["wfdash"])
    page = html(operator_client.get(reverse("dashboard:workflow", args=[run.pk])))
    assert 'id="wf-status"><span class="badge state-succeeded">' in page
    assert "Result" in page and '<pre class="json">' in page
    assert page.count('data-status="succeeded"') == 4
    assert "Cancel workflow" not in page  # it has ended


def test_an_unknown_workflow_is_404(viewer_client: Client) -> None:
    assert viewer_client.get(reverse("dashboard:workflow", args=[uuid.uuid4()])).status_code == 404
    assert viewer_client.get("/dashboard/workflows/not-an-id/").status_code == 404


def test_the_polling_answer_carries_the_head_and_every_box(viewer_client: Client) -> None:
    run = diamond()
    answer = viewer_client.get(reverse("dashboard:workflow-live", args=[run.pk]))
    body = html(answer)
    assert answer["Cache-Control"] == "no-store"
    assert 'id="wf-head"' in body and body.count('hx-swap-oob="true"') == 5


def test_a_large_workflow_is_counted_by_depth_with_links(
    viewer_client: Client, monkeypatch
) -> None:
    monkeypatch.setenv("DASHBOARD_WORKFLOW_MAX_BOXES", "3")
    run = diamond(on_failure="cancel")
    Job.objects.filter(pk=step(run, "a").pk).update(status="failed", finished_at=timezone.now())
    page = html(viewer_client.get(reverse("dashboard:workflow", args=[run.pk])))
    assert '<article id="step-' not in page and 'id="wf-large"' in page
    assert "4 steps in 3 depths" in page
    assert f"?workflow={run.pk}&amp;status=failed" in page
    assert "Ended without success" in page


# --- controls ------------------------------------------------------------------------------


def test_an_operator_cancels_the_workflow_with_a_reason(operator_client: Client) -> None:
    run = diamond()
    page = html(operator_client.get(reverse("dashboard:workflow", args=[run.pk])))
    assert f'action="/dashboard/workflows/{run.pk}/cancel/"' in page
    assert 'data-confirm="Cancel this workflow' in page
    response = operator_client.post(
        reverse("dashboard:workflow-cancel", args=[run.pk]), {"reason": "not today"}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("dashboard:workflow", args=[run.pk])
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert set(Job.objects.filter(workflow=run).values_list("status", flat=True)) == {"cancelled"}
    audit = OperatorAction.objects.get(target=str(run.pk))
    assert audit.reason == "not today" and audit.count == 4
    again = operator_client.post(reverse("dashboard:workflow-cancel", args=[run.pk]), follow=True)
    assert "already ended" in again.content.decode()


def test_viewers_cannot_cancel_or_retry(viewer_client: Client, nobody_client: Client) -> None:
    run = diamond()
    for client in (viewer_client, nobody_client):
        response = client.post(reverse("dashboard:workflow-cancel", args=[run.pk]))
        assert response.status_code == 403
        a = step(run, "a")
        assert client.post(reverse("dashboard:retry", args=[a.pk])).status_code == 403
    run.refresh_from_db()
    assert run.status == "running" and not OperatorAction.objects.exists()


def test_cancelling_an_unknown_workflow_is_404(operator_client: Client) -> None:
    response = operator_client.post(reverse("dashboard:workflow-cancel", args=[uuid.uuid4()]))
    assert response.status_code == 404


def test_retry_on_a_failed_step_resumes_a_held_workflow(operator_client: Client) -> None:
    flow = workflow("held", on_failure="hold")
    bad = flow.step(BOOM, {}, name="bad", queue="wfdash", max_attempts=1)
    flow.step(ADD, {"n": 1}, name="after", depends_on=[bad], queue="wfdash")
    run = flow.enqueue()
    drain_jobs(queues=["wfdash"])
    run.refresh_from_db()
    assert run.status == "held"
    url = reverse("dashboard:workflow", args=[run.pk])
    page = html(operator_client.get(url))
    failed = step(run, "bad")
    assert "wait for an operator" in page
    assert f'action="/dashboard/jobs/{failed.pk}/retry/"' in page
    assert page.count(">Retry</button>") == 1  # only the failed step
    after = step(run, "after")
    job_page = html(operator_client.get(reverse("dashboard:job", args=[after.pk])))
    assert "held for an operator: bad ended without success" in job_page
    response = operator_client.post(
        reverse("dashboard:retry", args=[failed.pk]), {"next": url, "reason": "fixed"}
    )
    assert response.status_code == 302 and response["Location"] == url
    run.refresh_from_db()
    assert run.status == "running"
    assert step(run, "bad").status == "queued"


# --- the job list and the job page -------------------------------------------------------


def test_the_job_list_filters_by_workflow(viewer_client: Client) -> None:
    run = diamond()
    other = diamond("other")
    page = html(viewer_client.get(reverse("dashboard:jobs"), {"workflow": str(run.pk)}))
    for name in "abcd":
        assert f"job-{step(run, name).pk}" in page
        assert f"job-{step(other, name).pk}" not in page
    assert f'href="/dashboard/workflows/{run.pk}/"' in page
    queued = html(
        viewer_client.get(reverse("dashboard:jobs"), {"workflow": str(run.pk), "status": "running"})
    )
    assert "No jobs match" in queued
    bad = html(viewer_client.get(reverse("dashboard:jobs"), {"workflow": "nope"}))
    assert "The workflow must be a workflow id." in bad
    count = html(viewer_client.get(reverse("dashboard:jobs-count"), {"workflow": str(run.pk)}))
    assert ">4<" in count


def test_a_bulk_cancel_on_the_workflow_filter_touches_only_its_steps(
    operator_client: Client,
) -> None:
    run = diamond()
    other = diamond("other")
    url = reverse("dashboard:bulk") + f"?workflow={run.pk}"
    operator_client.post(url, {"do": "cancel-filter", "confirm": "1"})
    assert set(Job.objects.filter(workflow=run).values_list("status", flat=True)) == {"cancelled"}
    assert set(Job.objects.filter(workflow=other).values_list("status", flat=True)) == {"queued"}


def test_a_steps_job_page_shows_its_workflow_and_what_it_waits_for(viewer_client: Client) -> None:
    run = diamond()
    drain_jobs(queues=["wfdash"], limit=2)  # a and b
    d = step(run, "d")
    page = html(viewer_client.get(reverse("dashboard:job", args=[d.pk])))
    assert f'href="/dashboard/workflows/{run.pk}/"' in page and "diamond" in page
    assert '<dd class="step-name">d</dd>' in page
    assert "waiting for 1 of 2 dependencies" in page
    assert "waiting for 1 dependency" in page  # the badge
    assert "Run now" not in page  # dependencies release it, not an operator
    deps = page[page.index('id="job-dependencies"') :]
    assert re.search(r'<span class="step-name">c</span>.*?not met', deps, re.S)
    assert re.search(r'<span class="step-name">b</span>.*?state-succeeded.*?>met<', deps, re.S)
    assert "on failure: cancel" in deps
    a = html(viewer_client.get(reverse("dashboard:job", args=[step(run, "a").pk])))
    assert "This job waits for no other job." in a


# --- escaping --------------------------------------------------------------------------------


def test_hostile_names_and_payloads_are_shown_as_text(operator_client: Client) -> None:
    flow = workflow(HOSTILE_SCRIPT)
    first = flow.step(ADD, {"note": HOSTILE_IMG}, name=HOSTILE_IMG, queue="wfdash")
    flow.step(BOOM, {"x": HOSTILE_SCRIPT}, name=HOSTILE_SCRIPT, depends_on=[first], queue="wfdash")
    run = flow.enqueue()
    pages = [
        html(operator_client.get(reverse("dashboard:workflows"))),
        html(operator_client.get(reverse("dashboard:workflow", args=[run.pk]))),
        html(operator_client.get(reverse("dashboard:workflow-live", args=[run.pk]))),
        html(operator_client.get(reverse("dashboard:jobs"), {"workflow": str(run.pk)})),
    ]
    for job in Job.objects.filter(workflow=run):
        pages.append(html(operator_client.get(reverse("dashboard:job", args=[job.pk]))))
    for page in pages:
        assert "<script>window" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in pages[1]
    assert "&lt;img src=x onerror=" in pages[1]
    response = operator_client.get(reverse("dashboard:workflow", args=[run.pk]))
    assert "script-src 'self'" in response["Content-Security-Policy"]


# --- live over the WebSocket ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_step_changes_reach_the_workflow_page_over_the_socket(monkeypatch) -> None:
    from channels.testing import WebsocketCommunicator

    monkeypatch.setenv("DASHBOARD_RELAY_INTERVAL_SECONDS", "0.05")
    db = database_sync_to_async
    viewer = await db(make_user)("viewer")
    run = await db(diamond)()
    comm = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    comm.scope["user"] = viewer
    try:
        connected, _ = await comm.connect(timeout=5)
        assert connected
        await comm.send_json_to({"subscribe": {"page": "workflow", "workflow": str(run.pk)}})
        catch_up = await _receive(comm, lambda m: "html" in m)
        assert 'id="wf-head"' in catch_up["html"]
        await _receive(comm, lambda m: m.get("subscribed") == "workflow")
        await db(drain_jobs)(queues=["wfdash"], limit=1)  # a succeeds; b and c are released
        a, b = await db(lambda: (step(run, "a").pk, step(run, "b").pk))()
        pushed = await _receive(comm, lambda m: f'id="step-{a}"' in m.get("html", ""))
        assert 'data-status="succeeded"' in pushed["html"]
        assert f'id="step-{b}"' in pushed["html"]  # its dependent's count moved too
        await comm.send_json_to({"subscribe": {"page": "workflow", "workflow": "nope"}})
        assert "error" in await _receive(comm, lambda m: "error" in m)
    finally:
        await comm.disconnect()
        await asyncio.sleep(0)
        assert not relay.subscribers
        await db(connections.close_all)()


@pytest.mark.asyncio
async def test_a_large_workflows_counts_reach_its_page_over_the_socket(monkeypatch) -> None:
    from channels.testing import WebsocketCommunicator

    monkeypatch.setenv("DASHBOARD_RELAY_INTERVAL_SECONDS", "0.05")
    monkeypatch.setenv("DASHBOARD_SUMMARY_REFRESH_SECONDS", "0.3")
    monkeypatch.setenv("DASHBOARD_WORKFLOW_MAX_BOXES", "3")
    db = database_sync_to_async
    operator = await db(make_user)("operator")
    run = await db(diamond)()
    comm = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    comm.scope["user"] = operator
    try:
        assert (await comm.connect(timeout=5))[0]
        await comm.send_json_to({"subscribe": {"page": "workflow", "workflow": str(run.pk)}})
        catch_up = await _receive(comm, lambda m: "html" in m)
        assert 'id="wf-large"' in catch_up["html"] and "<article" not in catch_up["html"]
        await _receive(comm, lambda m: m.get("subscribed") == "workflow")
        await db(drain_jobs)(queues=["wfdash"], limit=1)
        await db(drain_jobs)(queues=["wfdash"], limit=1)  # a second change within 0.3 s
        # Both arrive, the last with the counts at most 0.3 s after the previous render.
        pushed = await _receive(
            comm, lambda m: 'id="wf-large"' in m.get("html", "") and "succeeded 2" in m["html"]
        )
        assert "Cancel workflow" in pushed["html"]
    finally:
        await comm.disconnect()
        await asyncio.sleep(0)
        assert not relay.subscribers
        await db(connections.close_all)()


async def _receive(comm, predicate, timeout: float = 5.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise AssertionError("Timed out waiting for a WebSocket message.")
        message = await comm.receive_json_from(timeout=left)
        if predicate(message):
            return message


# --- 10,000 steps -------------------------------------------------------------------------------


def _fan_in(n: int) -> Workflow:
    flow = workflow(f"fan-in {n}")
    firsts = [flow.step(ADD, {"n": i}, name=f"s{i}", queue="wfdash-big") for i in range(n)]
    flow.step(ADD, {}, name="total", depends_on=firsts, queue="wfdash-big")
    return flow.enqueue()


def _chain(n: int) -> Workflow:
    flow = workflow(f"chain {n}")
    previous = None
    for i in range(n):
        previous = flow.step(
            ADD, {}, name=f"c{i}", depends_on=[previous] if previous else [], queue="wfdash-big"
        )
    return flow.enqueue()


# Timed requests per page: a few in the suite (the figures need more: bench/README.md,
# CONTROLPLANE_TEST_BENCH_RUNS=20 with -s).
BENCH_RUNS = int(os.environ.get("CONTROLPLANE_TEST_BENCH_RUNS", "3"))


def _timed(client: Client, url: str, runs: int = BENCH_RUNS) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)]


def test_bench_a_page_of_10000_steps(operator_client: Client) -> None:
    """Bench-like: prints the server time of the page (no timed assertion)."""
    fan = _fan_in(10_000)
    chain = _chain(2_000)
    Job.objects.filter(workflow=fan, step__in=[f"s{i}" for i in range(100)]).update(
        status="failed", finished_at=timezone.now()
    )
    vendor = connections["default"].vendor
    for label, run in (("fan-in 10,000 -> 1", fan), ("chain of 2,000", chain)):
        url = reverse("dashboard:workflow", args=[run.pk])
        page = html(operator_client.get(url))
        assert 'id="wf-large"' in page and '<article id="step-' not in page
        p50, p95 = _timed(operator_client, url)
        live50, live95 = _timed(operator_client, reverse("dashboard:workflow-live", args=[run.pk]))
        print(
            f"\n[bench {vendor}] workflow page, {label}: p50 {p50:.1f} ms, p95 {p95:.1f} ms;"
            f" polling answer p50 {live50:.1f} ms, p95 {live95:.1f} ms"
        )
    page = html(operator_client.get(reverse("dashboard:workflow", args=[chain.pk])))
    assert "2,000 steps in 2,000 depths" in page and "<td>0–19</td>" in page  # 100 rows
    assert page.count("<tr><td>") == 100
    page = html(operator_client.get(reverse("dashboard:workflow", args=[fan.pk])))
    assert "10,001 steps in 2 depths" in page and ">Retry</button>" in page
    assert "and 50 more" in page
    small = _fan_in(499)
    p50, p95 = _timed(operator_client, reverse("dashboard:workflow", args=[small.pk]))
    page = html(operator_client.get(reverse("dashboard:workflow", args=[small.pk])))
    assert page.count('class="wf-step ') == 500
    print(f"[bench {vendor}] workflow page, 500 boxes drawn: p50 {p50:.1f} ms, p95 {p95:.1f} ms")
    total = Job.objects.get(workflow=fan, step="total")
    started = time.perf_counter()
    job_page = html(operator_client.get(reverse("dashboard:job", args=[total.pk])))
    took = (time.perf_counter() - started) * 1000
    assert "waiting for 10000 of 10000 dependencies" in job_page and "and 9950 more" in job_page
    print(f"[bench {vendor}] job page of the step waiting for 10,000: {took:.1f} ms")


def test_the_queues_page_links_a_workflow_cancel_to_its_workflow(operator_client: Client) -> None:
    run = diamond()
    operator_client.post(reverse("dashboard:workflow-cancel", args=[run.pk]), {"reason": "stop"})
    page = html(operator_client.get(reverse("dashboard:queues")))
    assert "Workflow cancelled" in page and f'href="/dashboard/workflows/{run.pk}/"' in page
