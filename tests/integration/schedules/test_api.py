"""Schedule routes: CRUD, validation, permissions, audit, history; ``GET /jobs?schedule=``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs.models import OperatorAction, Schedule
from jobs.schedules.firing import fire_due_schedules
from tests.factories import unique_queue
from tests.integration.api.conftest import assert_error_shape

pytestmark = pytest.mark.django_db

CONTRACT_KEYS = {
    "id",
    "operation",
    "cron",
    "every_seconds",
    "paused",
    "next_fire_at",
    "last_fire_at",
}
KEYS = CONTRACT_KEYS | {
    "name",
    "payload",
    "queue",
    "priority",
    "timezone",
    "catch_up",
    "overlap",
    "source",
    "last_outcome",
    "last_job",
    "workflow",
    "last_workflow",
    "created_at",
    "updated_at",
}


def when(text: str | None) -> datetime | None:
    return parse_datetime(text) if text else None


def actions() -> list[tuple[str, str, str]]:
    return list(OperatorAction.objects.order_by("id").values_list("username", "action", "target"))


def create(api, **body):
    body.setdefault("operation", "ping")
    if "cron" not in body and "every_seconds" not in body:
        body["every_seconds"] = 60
    response = api.post("/schedules", body)
    assert response.status_code == 201, response.content
    return response.json()


def test_create_list_and_read(operator):
    made = create(operator, cron="*/5 * * * *", name="five", queue="q1", priority=3)
    assert set(made) == KEYS
    assert made["cron"] == "*/5 * * * *" and made["every_seconds"] is None
    assert made["source"] == "api" and made["paused"] is False
    assert made["last_fire_at"] is None and made["last_outcome"] is None
    nxt = when(made["next_fire_at"])
    assert nxt > timezone.now() and nxt.minute % 5 == 0 and nxt.second == 0
    other = create(operator, every_seconds=30, timezone="Europe/Berlin", catch_up="all")
    assert other["name"].startswith("ping-") and other["catch_up"] == "all"
    listing = operator.get("/schedules")
    assert listing.status_code == 200
    assert [s["name"] for s in listing.json()["results"]] == sorted(["five", other["name"]])
    detail = operator.get(f"/schedules/{made['id']}").json()
    assert set(detail) == KEYS | {"history"} and detail["history"] == []
    assert actions() == [
        ("operator", "schedule_create", "five"),
        ("operator", "schedule_create", other["name"]),
    ]


def test_a_fire_shows_in_the_schedule_and_in_the_job_list(operator):
    made = create(operator, every_seconds=60, queue=unique_queue())
    create(operator, every_seconds=60)  # another schedule's jobs stay out of the filter
    slot = when(made["next_fire_at"])
    fire_due_schedules(slot + timedelta(seconds=1))
    detail = operator.get(f"/schedules/{made['id']}").json()
    [job] = assert_enqueued("ping", queue=made["queue"], schedule=made["id"], count=1)
    assert when(detail["last_fire_at"]) == slot
    assert detail["last_outcome"] == "queued" and detail["last_job"] == str(job.pk)
    [entry] = detail["history"]
    assert when(entry["fire_at"]) == slot
    assert entry["outcome"] == "enqueued"
    assert (entry["job"], entry["job_status"]) == (str(job.pk), "queued")
    listed = operator.get("/jobs", schedule=made["id"]).json()["results"]
    assert [j["id"] for j in listed] == [str(job.pk)]
    assert listed[0]["schedule"] == made["id"]
    assert_enqueued(count=2)
    assert operator.get(f"/jobs/{job.pk}").json()["schedule"] == made["id"]
    assert operator.get("/jobs", schedule=str(uuid.uuid4())).json()["results"] == []
    body = assert_error_shape(operator.get("/jobs", schedule="nope"), 400)
    assert "schedule" in body["errors"]


def test_change_a_schedule(operator):
    made = create(operator, every_seconds=60)
    response = operator.request("PATCH", f"/schedules/{made['id']}", {"cron": "0 3 * * *"})
    assert response.status_code == 200, response.content
    changed = response.json()
    assert changed["cron"] == "0 3 * * *" and changed["every_seconds"] is None
    nxt = when(changed["next_fire_at"]).astimezone(UTC)
    assert (nxt.hour, nxt.minute) == (3, 0)
    response = operator.request(
        "PATCH",
        f"/schedules/{made['id']}",
        {"every_seconds": 5, "priority": -2, "overlap": "skip", "timezone": "Asia/Tokyo"},
    )
    changed = response.json()
    assert changed["cron"] is None and changed["every_seconds"] == 5.0
    assert (changed["priority"], changed["overlap"], changed["timezone"]) == (
        -2,
        "skip",
        "Asia/Tokyo",
    )
    assert when(changed["next_fire_at"]) - timezone.now() <= timedelta(seconds=5)
    assert ("operator", "schedule_update", made["name"]) in actions()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": {"unexpected": 1}}, "payload"),
        ({"cron": "0 3 * * *", "every_seconds": 5}, "cron"),
        ({"every_seconds": None}, "cron"),
        ({"cron": "every day"}, "cron"),
        ({"timezone": "Nowhere/City"}, "timezone"),
        ({"operation": "sleep"}, "operation"),
        ({"name": "renamed"}, "name"),
        ({"priority": 500}, "priority"),
    ],
)
def test_a_bad_change_is_refused_and_changes_nothing(operator, body, field):
    made = create(operator, every_seconds=60)
    response = operator.request("PATCH", f"/schedules/{made['id']}", body)
    errors = assert_error_shape(response, 400)["errors"]
    assert any(name.startswith(field) for name in errors), errors
    assert operator.get(f"/schedules/{made['id']}").json()["every_seconds"] == 60.0


def test_delete_keeps_the_jobs_it_fired(operator):
    made = create(operator, every_seconds=60)
    fire_due_schedules(when(made["next_fire_at"]))
    [job] = assert_enqueued(schedule=made["id"], count=1)
    response = operator.request("DELETE", f"/schedules/{made['id']}")
    assert response.status_code == 204 and response.content == b""
    assert_error_shape(operator.get(f"/schedules/{made['id']}"), 404)
    job.refresh_from_db()
    assert job.schedule_id is None and job.status == "queued"
    refute_enqueued(schedule=made["id"])
    assert ("operator", "schedule_delete", made["name"]) in actions()
    assert_error_shape(operator.request("DELETE", f"/schedules/{made['id']}"), 404)


def test_pause_resume_and_run_now(operator):
    made = create(operator, every_seconds=60, name="nightly")
    paused = operator.post(f"/schedules/{made['id']}/pause").json()
    assert paused["paused"] is True
    assert fire_due_schedules(timezone.now() + timedelta(hours=3)).fired == 0
    resumed = operator.post(f"/schedules/{made['id']}/resume").json()
    assert resumed["paused"] is False
    nxt = when(resumed["next_fire_at"])
    assert timezone.now() < nxt <= timezone.now() + timedelta(seconds=60)
    response = operator.post(f"/schedules/{made['id']}/run")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["schedule"] == made["id"] and job["operation"] == "ping"
    assert job["status"] == "queued"
    [stored] = assert_enqueued("ping", schedule=made["id"], count=1)
    assert str(stored.pk) == job["id"]
    detail = operator.get(f"/schedules/{made['id']}").json()
    assert [(h["outcome"], h["job"]) for h in detail["history"]] == [("run_now", job["id"])]
    assert detail["next_fire_at"] == resumed["next_fire_at"]
    assert [a[1] for a in actions()] == [
        "schedule_create",
        "schedule_pause",
        "schedule_resume",
        "schedule_run",
    ]
    assert {a[2] for a in actions()} == {"nightly"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"operation": "no.such.operation", "every_seconds": 60}, "operation"),
        ({"operation": "ping", "every_seconds": 60, "payload": {"x": 1}}, "payload"),
        ({"operation": "ping", "every_seconds": 60, "payload": [1]}, "payload"),
        ({"operation": "sleep", "every_seconds": 60, "payload": {}}, "payload.seconds"),
        ({"operation": "ping"}, "cron"),
        ({"operation": "ping", "cron": "* * * * *", "every_seconds": 60}, "cron"),
        ({"operation": "ping", "cron": "61 * * * *"}, "cron"),
        ({"operation": "ping", "cron": "* * * *"}, "cron"),
        ({"operation": "ping", "every_seconds": 0.5}, "every_seconds"),
        ({"operation": "ping", "every_seconds": "often"}, "every_seconds"),
        ({"operation": "ping", "every_seconds": 60, "timezone": "Mars/Base"}, "timezone"),
        ({"operation": "ping", "every_seconds": 60, "priority": 101}, "priority"),
        ({"operation": "ping", "every_seconds": 60, "priority": 1.5}, "priority"),
        ({"operation": "ping", "every_seconds": 60, "catch_up": "some"}, "catch_up"),
        ({"operation": "ping", "every_seconds": 60, "overlap": "never"}, "overlap"),
        ({"operation": "ping", "every_seconds": 60, "name": "a\x00b"}, "name"),
        ({"operation": "ping", "every_seconds": 60, "name": "a\ud800b"}, "name"),
        ({"operation": "ping", "every_seconds": 60, "queue": "q\ud800"}, "queue"),
        ({"operation": "ping\x00", "every_seconds": 60}, "operation"),
        ({"operation": "ping", "cron": "* * * * \x00"}, "cron"),
        ({"operation": "ping", "every_seconds": 60, "timezone": "UTC\ud800"}, "timezone"),
        ({"operation": "ping", "every_seconds": 60, "payload": {"k": "\x00"}}, "payload"),
        ({"operation": "ping", "every_seconds": 60, "payload": {"\ud800": 1}}, "payload"),
        ({"operation": "ping", "every_seconds": 60, "colour": "red"}, "colour"),
        ({"every_seconds": 60}, "operation"),
    ],
)
def test_bad_definitions_are_a_400_naming_the_field(operator, body, field):
    response = operator.post("/schedules", body)
    errors = assert_error_shape(response, 400)["errors"]
    assert any(name.startswith(field) for name in errors), errors
    assert not Schedule.objects.exists()
    assert not OperatorAction.objects.exists()


def test_a_body_that_is_not_an_object_and_a_duplicate_name(operator):
    assert_error_shape(operator.post("/schedules", [1, 2]), 400)
    create(operator, name="once")
    body = assert_error_shape(
        operator.post("/schedules", {"operation": "ping", "every_seconds": 5, "name": "once"}), 400
    )
    assert "name" in body["errors"]
    assert Schedule.objects.count() == 1


def test_unknown_ids_are_a_404(operator):
    for path in (f"/schedules/{uuid.uuid4()}", "/schedules/not-a-uuid"):
        assert_error_shape(operator.get(path), 404)
        assert_error_shape(operator.request("PATCH", path, {"priority": 1}), 404)
        for action in ("pause", "resume", "run"):
            assert_error_shape(operator.post(f"{path}/{action}"), 404)
    assert_error_shape(operator.get("/schedules/a/b/c"), 404)


def test_schedules_declared_in_code_are_changed_in_code(operator, settings):
    from jobs.schedules.declared import sync_code_schedules

    settings.CONTROLPLANE = {
        "SCHEDULES": [{"name": "from-settings", "operation": "ping", "every_seconds": 60}]
    }
    sync_code_schedules()
    code = Schedule.objects.get(name="from-settings")
    assert operator.get(f"/schedules/{code.pk}").json()["source"] == "code"
    body = assert_error_shape(
        operator.request("PATCH", f"/schedules/{code.pk}", {"priority": 1}), 409
    )
    assert "declared in code" in body["message"]
    assert_error_shape(operator.request("DELETE", f"/schedules/{code.pk}"), 409)
    # Operators still pause, resume and run it.
    assert operator.post(f"/schedules/{code.pk}/pause").json()["paused"] is True
    assert operator.post(f"/schedules/{code.pk}/run").status_code == 201


def test_permissions(api_for, operator):
    made = create(operator)
    path = f"/schedules/{made['id']}"
    writes = [
        ("POST", "/schedules", {"operation": "ping", "every_seconds": 60}),
        ("PATCH", path, {"priority": 1}),
        ("DELETE", path, None),
        ("POST", f"{path}/pause", None),
        ("POST", f"{path}/resume", None),
        ("POST", f"{path}/run", None),
    ]
    anonymous, viewer, remote = api_for("anonymous"), api_for("viewer"), api_for("remote")
    for method, route, body in [("GET", "/schedules", None), ("GET", path, None), *writes]:
        assert_error_shape(anonymous.request(method, route, body), 401)
        assert_error_shape(remote.request(method, route, body), 403)
    assert viewer.get("/schedules").status_code == 200
    assert viewer.get(path).status_code == 200
    for method, route, body in writes:
        assert_error_shape(viewer.request(method, route, body), 403)
    assert Schedule.objects.get(pk=made["id"]).priority == 0
    assert [a[1] for a in actions()] == ["schedule_create"]


def test_run_now_that_enqueue_refuses_is_a_400_leaving_nothing(operator):
    from jobs.operations import operation, registry

    operation("test.short_lived")(lambda ctx, payload: None)
    try:
        made = create(operator, operation="test.short_lived")
    finally:
        registry.unregister("test.short_lived")
    body = assert_error_shape(operator.post(f"/schedules/{made['id']}/run"), 400)
    assert "operation" in body["errors"]
    assert operator.get(f"/schedules/{made['id']}").json()["history"] == []
    assert [a[1] for a in actions()] == ["schedule_create"]


def test_the_schema_describes_the_schedule_routes(viewer):
    paths = viewer.get("/schema").json()["paths"]
    routes = {(m, p) for p, ops in paths.items() for m in ops if p.startswith("/schedules")}
    assert routes == {
        ("get", "/schedules"),
        ("post", "/schedules"),
        ("get", "/schedules/{schedule_id}"),
        ("patch", "/schedules/{schedule_id}"),
        ("delete", "/schedules/{schedule_id}"),
        ("post", "/schedules/{schedule_id}/pause"),
        ("post", "/schedules/{schedule_id}/resume"),
        ("post", "/schedules/{schedule_id}/run"),
    }
    assert "schedule" in {p["name"] for p in paths["/jobs"]["get"]["parameters"]}
