"""The dashboard's "New schedule" form takes a workflow's JSON instead of an operation."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from jobs.models import Schedule
from tests.factories import unique_queue
from tests.integration.dashboard.conftest import operator_client  # noqa: F401

pytestmark = pytest.mark.django_db

LIST = "/dashboard/schedules/"
NEW = "/dashboard/schedules/new/"
BLANK = {"operation": "", "payload": "", "queue": "", "priority": "0", "timezone": "UTC"}


def flow() -> dict:
    queue = unique_queue()
    return {
        "name": "nightly <b>",
        "steps": [
            {"name": "fetch", "operation": "ping", "queue": queue},
            {"operation": "ping", "queue": queue, "depends_on": ["fetch"]},
        ],
    }


def test_a_workflow_schedule_is_created_from_the_form_and_listed(operator_client: Client):  # noqa: F811
    page = operator_client.get(LIST).content.decode()
    assert 'name="workflow"' in page
    response = operator_client.post(
        NEW, {**BLANK, "name": "wf-form", "every_seconds": "60", "workflow": json.dumps(flow())}
    )
    schedule = Schedule.objects.get(name="wf-form")
    assert response.status_code == 302, response.content[:500]
    assert schedule.operation == "" and schedule.workflow["steps"][1]["depends_on"] == ["fetch"]
    listed = operator_client.get(LIST).content.decode()
    assert "nightly &lt;b&gt;" in listed and "nightly <b>" not in listed


@pytest.mark.parametrize(
    ("workflow", "text"),
    [
        ("{not json", "Write a JSON object"),
        (
            json.dumps({"steps": [{"operation": "ping"}, {"operation": "x.y", "depends_on": []}]}),
            "steps.1.operation: ",
        ),
        (
            json.dumps({"steps": [{"operation": "ping", "depends_on": ["gone"]}]}),
            "steps.0.depends_on",
        ),
    ],
)
def test_a_bad_workflow_is_shown_beside_its_textarea(operator_client: Client, workflow, text):  # noqa: F811
    response = operator_client.post(
        NEW, {**BLANK, "name": "refused", "every_seconds": "60", "workflow": workflow}
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert text in " ".join(errors["workflow"]), errors
    assert not Schedule.objects.exists()


def test_operation_and_workflow_together_are_refused(operator_client: Client):  # noqa: F811
    response = operator_client.post(
        NEW,
        {**BLANK, "operation": "ping", "every_seconds": "60", "workflow": json.dumps(flow())},
    )
    assert response.status_code == 400
    assert "not both" in " ".join(response.context["form"].errors["workflow"])


def test_a_workflow_schedule_page_names_its_workflow_and_run_now_starts_one(
    operator_client: Client,  # noqa: F811
):
    operator_client.post(
        NEW, {**BLANK, "name": "wf-page", "every_seconds": "3600", "workflow": json.dumps(flow())}
    )
    schedule = Schedule.objects.get(name="wf-page")
    page = operator_client.get(f"/dashboard/schedules/{schedule.pk}/").content.decode()
    assert "Workflow</dt>" in page and "nightly &lt;b&gt;, 2 steps" in page
    assert "It starts one nightly &lt;b&gt; workflow at once." in page
    ran = operator_client.post(f"/dashboard/schedules/{schedule.pk}/run/", follow=True)
    assert "Schedule ran now: workflow" in ran.content.decode()
