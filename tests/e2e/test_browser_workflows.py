"""A workflow's page in a real browser: steps change state live (over the WebSocket, and by
polling when it cannot connect), hostile step names stay text, and the Cancel button
cancels the workflow."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from django_controlplane.testing import drain_jobs
from jobs.models import Job, Workflow
from jobs.workflows import workflow
from tests.factories import ECHO, HOSTILE_IMG, HOSTILE_SCRIPT, unique_queue

pytestmark = pytest.mark.e2e


def _chain(queue: str, first: str = "fetch") -> Workflow:
    flow = workflow("nightly report")
    a = flow.step(ECHO, {"n": 1}, name=first, queue=queue)
    b = flow.step(ECHO, {"n": 2}, name="transform", depends_on=[a], queue=queue)
    flow.step(ECHO, {"n": 3}, name="publish", depends_on=[b], queue=queue)
    return flow.enqueue()


def test_steps_change_live_and_the_workflow_is_cancelled_from_its_page(open_page) -> None:
    queue = unique_queue("wf")
    run = _chain(queue, first=HOSTILE_SCRIPT)
    first = Job.objects.get(workflow=run, step=HOSTILE_SCRIPT)
    second = Job.objects.get(workflow=run, step="transform")
    page = open_page("operator")
    page.goto(f"/dashboard/workflows/{run.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.__sameDocument = true")
    # Three columns by depth; the hostile name is text, not markup.
    expect(page.locator(".wf-column")).to_have_count(3)
    expect(page.locator(f"#step-{first.pk} .step-name")).to_have_text(HOSTILE_SCRIPT)
    expect(page.locator(f"#step-{second.pk} .wf-waits")).to_contain_text(HOSTILE_SCRIPT)
    expect(page.locator(f"#step-{first.pk}")).to_have_attribute("data-status", "queued")
    expect(page.locator(f"#step-{second.pk} .wf-step-status")).to_contain_text("waiting")

    drain_jobs(queues=[queue], limit=1)  # the first step runs in this process

    expect(page.locator(f"#step-{first.pk}")).to_have_attribute("data-status", "succeeded")
    # Its dependent was released in the same transaction: no longer "waiting".
    expect(page.locator(f"#step-{second.pk} .wf-step-status")).to_have_text("queued")
    expect(page.locator("#wf-counts")).to_contain_text("succeeded 1")
    assert page.evaluate("window.__sameDocument") is True  # no reload
    assert page.evaluate("window.__pwned") is None

    page.fill("#wf-cancel input[name=reason]", "bad input data")
    page.click("#wf-cancel button[type=submit]")  # confirm() is accepted by the fixture
    expect(page.locator("#wf-status .badge")).to_have_text("cancelled")
    expect(page.locator(".message")).to_contain_text("Workflow cancelled: 2 steps stopped.")
    expect(page.locator(f"#step-{second.pk}")).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#wf-cancel")).to_have_count(0)
    run.refresh_from_db()
    assert run.status == "cancelled"
    # A cancelled step may be retried from its box.
    expect(page.locator(f"#step-{second.pk} .wf-step-retry button")).to_be_visible()

    page.click(f"#step-{second.pk} .wf-step-link")
    expect(page).to_have_url(re.compile(rf"/dashboard/jobs/{second.pk}/$"))
    expect(page.locator("#job-facts")).to_contain_text("nightly report")
    expect(page.locator("#job-dependencies")).to_contain_text(HOSTILE_SCRIPT)


def test_the_workflow_page_polls_when_the_socket_cannot_connect(open_page) -> None:
    queue = unique_queue("wfpoll")
    run = _chain(queue, first=HOSTILE_IMG)
    first = Job.objects.get(workflow=run, step=HOSTILE_IMG)
    page = open_page("viewer")
    page.route_web_socket(re.compile(r".*/ws/dashboard/"), lambda ws: ws.close())
    page.goto(f"/dashboard/workflows/{run.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "polling")
    expect(page.locator("#wf-cancel")).to_have_count(0)  # a viewer has no controls
    drain_jobs(queues=[queue], limit=1)
    expect(page.locator(f"#step-{first.pk}")).to_have_attribute(
        "data-status", "succeeded", timeout=10_000
    )
    assert page.evaluate("window.__pwned") is None
