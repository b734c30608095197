"""Workflow schedules through the REST API: created, shown, changed, refused by field, run now."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils.dateparse import parse_datetime

from jobs.models import Job, Schedule, Workflow
from jobs.schedules.firing import fire_due_schedules
from tests.factories import unique_queue
from tests.integration.api.conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def spec(**top: Any) -> dict[str, Any]:
    queue = unique_queue()
    return {
        "name": "nightly",
        "steps": [
            {"name": "fetch", "operation": "ping", "queue": queue},
            {"name": "merge", "operation": "ping", "queue": queue, "depends_on": ["fetch"]},
        ],
        **top,
    }


def create(api, **body: Any) -> dict[str, Any]:
    body.setdefault("every_seconds", 60)
    response = api.post("/schedules", body)
    assert response.status_code == 201, response.content
    return response.json()


def test_create_show_and_fire_a_workflow_schedule(operator):
    made = create(operator, workflow=spec(), name="nightly-flow")
    assert made["operation"] is None and made["workflow"]["name"] == "nightly"
    assert made["payload"] == {} and made["queue"] is None and made["last_workflow"] is None
    listed = operator.get("/schedules").json()["results"]
    assert [s["workflow"]["steps"][1]["name"] for s in listed] == ["merge"]
    fire_due_schedules(parse_datetime(made["next_fire_at"]))
    [run] = Workflow.objects.filter(schedule_id=made["id"])
    detail = operator.get(f"/schedules/{made['id']}/").json()
    assert detail["last_workflow"] == str(run.pk) and detail["last_job"] is None
    assert detail["last_outcome"] == "running"
    [entry] = detail["history"]
    assert (entry["outcome"], entry["job"], entry["workflow"], entry["workflow_status"]) == (
        "enqueued",
        None,
        str(run.pk),
        "running",
    )


@pytest.mark.parametrize(
    ("workflow", "field"),
    [
        ({"steps": [{"operation": "no.such.op"}]}, "workflow.steps.0.operation"),
        (
            {"steps": [{"operation": "ping"}, {"operation": "ping", "depends_on": ["nope"]}]},
            "workflow.steps.1.depends_on",
        ),
        ({"steps": [{"operation": "ping", "payload": {"x": 1}}]}, "workflow.steps.0.payload"),
        ({"steps": [{"operation": "ping", "max_attempts": 0}]}, "workflow.steps.0.max_attempts"),
        ({"steps": "fetch"}, "workflow.steps"),
        ({"steps": [{"operation": "ping"}], "colour": 1}, "workflow.colour"),
        ([1, 2], "workflow"),
    ],
)
def test_a_bad_workflow_is_a_400_naming_the_field(operator, workflow, field):
    body = assert_error_shape(
        operator.post("/schedules", {"workflow": workflow, "every_seconds": 60}), 400
    )
    assert field in body["errors"], body["errors"]
    assert not Schedule.objects.exists()


def test_operation_and_workflow_exactly_one(operator):
    both = operator.post(
        "/schedules", {"operation": "ping", "workflow": spec(), "cron": "0 3 * * *"}
    )
    assert "workflow" in assert_error_shape(both, 400)["errors"]
    neither = operator.post("/schedules", {"every_seconds": 60})
    assert "operation" in assert_error_shape(neither, 400)["errors"]
    own = operator.post("/schedules", {"workflow": spec(), "every_seconds": 60, "queue": "q"})
    assert "queue" in assert_error_shape(own, 400)["errors"]


def test_patch_changes_the_steps_and_refuses_bad_ones(operator):
    made = create(operator, workflow=spec())
    changed = spec(name="renamed-flow")
    response = operator.request("PATCH", f"/schedules/{made['id']}", {"workflow": changed})
    assert response.status_code == 200, response.content
    assert response.json()["workflow"]["name"] == "renamed-flow"
    bad = {"steps": [{"operation": "ping", "depends_on": ["x"]}]}
    body = assert_error_shape(
        operator.request("PATCH", f"/schedules/{made['id']}", {"workflow": bad}), 400
    )
    assert "workflow.steps.0.depends_on" in body["errors"]
    assert Schedule.objects.get(pk=made["id"]).workflow["name"] == "renamed-flow"
    job_schedule = operator.post("/schedules", {"operation": "ping", "every_seconds": 60}).json()
    body = assert_error_shape(
        operator.request("PATCH", f"/schedules/{job_schedule['id']}", {"workflow": spec()}), 400
    )
    assert "workflow" in body["errors"]


def test_run_now_answers_the_workflow_it_started(operator, viewer):
    made = create(operator, workflow=spec())
    response = operator.post(f"/schedules/{made['id']}/run")
    assert response.status_code == 201, response.content
    started = response.json()
    assert set(started) == {"id", "name", "status", "schedule", "created_at"}
    assert (started["name"], started["status"], started["schedule"]) == (
        "nightly",
        "running",
        made["id"],
    )
    assert Job.objects.filter(workflow_id=started["id"]).count() == 2
    assert viewer.post(f"/schedules/{made['id']}/run").status_code == 403
    assert Workflow.objects.count() == 1
    nxt = parse_datetime(made["next_fire_at"])
    assert fire_due_schedules(nxt + timedelta(seconds=1)).fired == 1
