"""GET /operations: every operation that can be enqueued, local and remote-declared."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import RemoteOperation, Worker
from jobs.operations import registry
from jobs.remote_operations import soft_delete_orphan_operations

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db

KEYS = {
    "name",
    "queue",
    "max_attempts",
    "payload_schema",
    "kind",
    "description",
    "online",
    "enqueueable",
    "last_seen_at",
}
THUMBNAIL = {
    "name": "remote.thumbnail",
    "queue": "images",
    "max_attempts": 4,
    "payload_schema": {
        "type": "object",
        "required": ["url"],
        "properties": {"url": {"type": "string"}},
    },
}


def register(api, operations) -> str:
    response = api.post("/workers", {"name": "w", "operations": operations})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def listed(api, path: str = "/operations") -> dict[str, dict]:
    response = api.get(path)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"results"}
    names = [op["name"] for op in body["results"]]
    assert names == sorted(names) and len(names) == len(set(names))
    return {op["name"]: op for op in body["results"]}


def test_lists_local_and_remote_operations_with_their_fields(api_for, viewer):
    register(api_for("remote"), [THUMBNAIL, "ping"])
    ops = listed(viewer)
    assert set(registry.names()) <= set(ops)
    assert all(set(op) == KEYS for op in ops.values())
    ping, sleep = ops["ping"], ops["sleep"]
    assert ping["kind"] == "local" and ping["queue"] == "default" and ping["max_attempts"] == 1
    assert ping["payload_schema"] == registry.get("ping").payload_schema
    assert ping["enqueueable"] is True and ping["last_seen_at"] is None
    # A remote worker naming ping serves it; no worker at all serves sleep.
    assert ping["online"] is True and sleep["online"] is False
    remote = ops["remote.thumbnail"]
    assert {k: remote[k] for k in THUMBNAIL} == THUMBNAIL
    assert remote["kind"] == "remote" and remote["online"] is True
    assert remote["enqueueable"] is True and remote["last_seen_at"]
    # A live local worker serves every operation of its queues; a silent one serves none.
    Worker.objects.create(queues=["default"], last_heartbeat=timezone.now() - timedelta(hours=1))
    assert listed(viewer)["sleep"]["online"] is False
    Worker.objects.create(queues=["default"])
    assert listed(viewer)["sleep"]["online"] is True


def test_a_remote_operation_whose_worker_left_is_listed_offline_and_still_enqueueable(
    api_for, viewer, operator
):
    remote = api_for("remote")
    worker = register(remote, [THUMBNAIL])
    assert remote.request("DELETE", f"/workers/{worker}").status_code == 200
    op = listed(viewer)["remote.thumbnail"]
    assert (op["online"], op["enqueueable"]) == (False, True)
    created = operator.post(
        "/jobs", {"operation": "remote.thumbnail", "payload": {"url": "https://x"}}
    )
    assert created.status_code == 201, created.content
    assert (created.json()["status"], created.json()["queue"]) == ("queued", "images")


def test_after_the_grace_it_is_not_enqueueable_then_hidden(api_for, viewer, operator, settings):
    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REMOTE_OPERATION_GRACE_SECONDS": 3600}
    remote = api_for("remote")
    remote.request("DELETE", f"/workers/{register(remote, [THUMBNAIL])}")
    long_ago = timezone.now() - timedelta(hours=2)
    RemoteOperation.objects.filter(name="remote.thumbnail").update(last_seen_at=long_ago)
    op = listed(viewer)["remote.thumbnail"]
    assert (op["online"], op["enqueueable"]) == (False, False)
    refused = operator.post("/jobs", {"operation": "remote.thumbnail", "payload": {"url": "u"}})
    message = assert_error_shape(refused, 400)["errors"]["operation"][0]
    assert "remote workers declared it" in message and "1 hour" in message
    assert soft_delete_orphan_operations() == 1
    assert "remote.thumbnail" not in listed(viewer)


def test_a_remote_row_named_like_a_local_operation_is_listed_once_as_local(viewer):
    RemoteOperation.objects.create(name="ping", queue="elsewhere")
    ops = listed(viewer)
    assert ops["ping"]["kind"] == "local" and ops["ping"]["queue"] == "default"


@pytest.mark.parametrize(("role", "status"), [("anonymous", 401), ("remote", 403)])
def test_reading_needs_the_view_permission(api_for, role, status):
    body = assert_error_shape(api_for(role).get("/operations"), status)
    assert body["errors"] == {}


def test_with_and_without_a_trailing_slash_and_json_404_below(viewer):
    assert listed(viewer, "/operations") == listed(viewer, "/operations/")
    assert_error_shape(viewer.get("/operations/ping/nothing-here"), 404)


def test_the_schema_describes_the_list(viewer):
    doc = viewer.get("/schema").json()
    get = doc["paths"]["/operations"]["get"]
    assert {"200", "401", "403"} <= set(get["responses"])
    ref = get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    item = doc["components"]["schemas"][
        page["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[1]
    ]
    assert KEYS <= set(item["properties"])
