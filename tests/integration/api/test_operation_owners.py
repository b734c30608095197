"""Remote operations have an owner: the account that first declared one.

Another account may neither redeclare it (identically or not) nor serve it
(409, nothing changes); a superuser may. Enqueues keep following the owner's
declaration. Local and built-in operations are not served remotely unless
``REMOTE_MAY_SERVE_LOCAL``; every declaration change writes an audit row.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token

from jobs.models import Job, OperatorAction, RemoteOperation, Worker

from .conftest import ROLE_PERMISSIONS, Api, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def remote_may_serve_local(settings) -> None:
    """The default: remote workers do not serve local operations."""
    settings.CONTROLPLANE = {}


CHARGE = {
    "name": "billing.charge",
    "queue": "billing",
    "payload_schema": {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer", "minimum": 1}},
        "additionalProperties": False,
    },
    "max_attempts": 3,
}
HIJACK = {"name": "billing.charge", "queue": "robo2", "payload_schema": {"type": "object"}}


def account(name: str, *, superuser: bool = False) -> Api:
    user = make_user(name, ROLE_PERMISSIONS["remote"], superuser=superuser)
    return Api(Token.objects.create(user=user).key)


def register(api: Api, *operations: Any):
    return api.post("/workers", {"name": "w", "operations": list(operations)})


def test_the_first_account_owns_the_operation_and_the_audit_says_so() -> None:
    assert register(account("robo1"), CHARGE).status_code == 201
    row = RemoteOperation.objects.get(name="billing.charge")
    assert row.owner is not None and row.owner.username == "robo1"
    entry = OperatorAction.objects.get(action="declare_operation")
    assert (entry.username, entry.target, entry.filter["queue"]) == (
        "robo1",
        "billing.charge",
        "billing",
    )


@pytest.mark.parametrize("entry", [HIJACK, CHARGE, "billing.charge"], ids=["other", "same", "name"])
def test_another_account_cannot_redeclare_or_serve_it(entry: Any, operator: Api) -> None:
    assert register(account("robo1"), CHARGE).status_code == 201
    response = register(account("robo2"), entry)
    assert response.status_code == 409, response.content
    body = response.json()
    assert set(body) >= {"message", "errors"}
    assert "billing.charge" in body["message"] and "robo1" in body["message"]
    assert body["errors"] == {
        "operations.0.name": ["Operation 'billing.charge' is owned by robo1."]
    }
    row = RemoteOperation.objects.get(name="billing.charge")
    assert (row.queue, row.payload_schema, row.owner.username) == (
        "billing",
        CHARGE["payload_schema"],
        "robo1",
    )
    assert not Worker.objects.filter(user__username="robo2").exists()
    assert not OperatorAction.objects.filter(username="robo2").exists()
    # Enqueue follows the owner's declaration: its queue, its schema.
    assert operator.post("/jobs", {"operation": "billing.charge", "payload": {}}).status_code == 400
    created = operator.post("/jobs", {"operation": "billing.charge", "payload": {"amount": 5}})
    assert created.status_code == 201, created.content
    assert Job.objects.get(pk=created.json()["id"]).queue == "billing"


def test_the_owner_may_change_it_and_the_change_is_audited() -> None:
    robo1 = account("robo1")
    assert register(robo1, CHARGE).status_code == 201
    assert register(robo1, CHARGE).status_code == 201  # the same again: no new audit row
    assert OperatorAction.objects.filter(action="redeclare_operation").count() == 0
    assert register(robo1, {**CHARGE, "queue": "billing2"}).status_code == 201
    entry = OperatorAction.objects.get(action="redeclare_operation")
    assert entry.filter["queue"] == "billing2" and entry.filter["previous"]["queue"] == "billing"


def test_a_superuser_may_redeclare_it_and_the_owner_stays() -> None:
    assert register(account("robo1"), CHARGE).status_code == 201
    assert register(account("root", superuser=True), HIJACK).status_code == 201
    row = RemoteOperation.objects.get(name="billing.charge")
    assert (row.queue, row.owner.username) == ("robo2", "robo1")
    entry = OperatorAction.objects.get(action="redeclare_operation")
    assert entry.username == "root" and entry.filter["previous"]["queue"] == "billing"


def test_an_operation_without_an_owner_goes_to_its_next_declarer() -> None:
    RemoteOperation.objects.create(name="billing.charge", queue="old")
    assert register(account("robo1"), CHARGE).status_code == 201
    assert RemoteOperation.objects.get(name="billing.charge").owner.username == "robo1"
    assert register(account("robo2"), HIJACK).status_code == 409


@pytest.mark.parametrize("entry", ["ping", {"name": "ping", "queue": "x"}], ids=["name", "object"])
def test_local_operations_are_not_served_remotely(entry: Any) -> None:
    response = register(account("robo1"), entry)
    assert response.status_code == 403, response.content
    assert "ping" in response.json()["message"]
    assert not Worker.objects.exists()


def test_local_operations_may_be_served_remotely_when_configured() -> None:
    with override_settings(CONTROLPLANE={"REMOTE_MAY_SERVE_LOCAL": True}):
        assert register(account("robo1"), "ping").status_code == 201


def test_a_remote_claim_never_hands_out_a_local_job(operator: Api) -> None:
    robo = account("robo1")
    with override_settings(CONTROLPLANE={"REMOTE_MAY_SERVE_LOCAL": True}):
        worker = register(robo, "ping").json()["id"]
    assert operator.post("/jobs", {"operation": "ping", "payload": {}}).status_code == 201
    claimed = robo.post(f"/workers/{worker}/claim", {"limit": 5, "wait": 0})
    assert claimed.status_code in (200, 204), claimed.content
    assert claimed.status_code == 204 or claimed.json()["jobs"] == []
    assert Job.objects.get().status == "queued"
