"""``REMOTE_WORKER_GRANTS``: remote accounts serve only the operations and queues they are
allowed, per user or per Django group.

Unset, nothing changes. Set, a registration that declares or serves an operation or a
queue outside the account's grant is a 403 naming it and the knob, and changes nothing;
a claim asks only for the granted operations and queues as the knob reads now; an account
listed nowhere (superusers included) serves nothing; a malformed knob says what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from rest_framework.authtoken.models import Token

from django_controlplane.remote.grants import check_grants, parse_grants
from jobs.conf import DEFAULTS, knob
from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, OperatorAction, RemoteOperation, Worker

from .conftest import ROLE_PERMISSIONS, Api, assert_error_shape, make_user

pytestmark = pytest.mark.django_db


def declaration(name: str, queue: str) -> dict[str, Any]:
    return {"name": name, "queue": queue, "payload_schema": {"type": "object"}}


CHARGE = declaration("billing.charge", "billing")
REFUND = declaration("billing.refund", "billing")
RESIZE = declaration("images.resize", "images")


def account(name: str, *, groups: tuple[str, ...] = (), superuser: bool = False) -> Api:
    user = make_user(name, ROLE_PERMISSIONS["remote"], superuser=superuser)
    for group in groups:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    return Api(Token.objects.create(user=user).key)


def register(api: Api, *operations: Any, queues: list[str] | None = None):
    body: dict[str, Any] = {"name": "w", "operations": list(operations), "concurrency": 10}
    if queues is not None:
        body["queues"] = queues
    return api.post("/workers", body)


def claim(api: Api, worker_id: str, limit: int = 10) -> list[dict[str, Any]]:
    response = api.post(f"/workers/{worker_id}/claim", {"limit": limit, "wait": 0})
    assert response.status_code == 200, response.content
    return response.json()["jobs"]


@pytest.fixture
def grants(settings):
    """``grants(value)``: set ``REMOTE_WORKER_GRANTS`` (beside the API tests' other knobs)."""

    def set_grants(value: Any) -> None:
        settings.CONTROLPLANE = {**(settings.CONTROLPLANE or {}), "REMOTE_WORKER_GRANTS": value}

    return set_grants


def grant(operations: list[str], queues: list[str]) -> dict[str, list[str]]:
    return {"operations": operations, "queues": queues}


def assert_nothing_registered(username: str) -> None:
    assert not Worker.objects.filter(user__username=username).exists()
    assert not RemoteOperation.objects.filter(owner__username=username).exists()
    assert not OperatorAction.objects.filter(username=username).exists()


# --- unset: today's behaviour -----------------------------------------------------------


def test_unset_there_is_no_allow_list() -> None:
    assert DEFAULTS["REMOTE_WORKER_GRANTS"] is None and knob("REMOTE_WORKER_GRANTS") is None
    robo = account("robo1")
    response = register(robo, CHARGE, RESIZE, queues=["billing", "images", "anything"])
    assert response.status_code == 201, response.content
    worker = response.json()["id"]
    charge = enqueue("billing.charge", {}, queue="billing")
    resize = enqueue("images.resize", {}, queue="anything")
    assert {j["id"] for j in claim(robo, worker)} == {str(charge.pk), str(resize.pk)}


# --- per user, per group ----------------------------------------------------------------


def test_a_user_grant_allows_its_operations_and_queues(grants) -> None:
    grants({"users": {"robo1": grant(["billing.*"], ["billing", "billing-*"])}})
    robo = account("robo1")
    response = register(robo, CHARGE, REFUND, queues=["billing", "billing-slow"])
    assert response.status_code == 201, response.content
    charge = enqueue("billing.charge", {}, queue="billing-slow")
    assert [j["id"] for j in claim(robo, response.json()["id"])] == [str(charge.pk)]


def test_a_user_grant_refuses_other_operations_naming_them_and_the_knob(grants) -> None:
    grants({"users": {"robo1": grant(["billing.*"], ["*"])}})
    response = register(account("robo1"), CHARGE, RESIZE)
    body = assert_error_shape(response, 403)
    assert "images.resize" in body["message"] and "REMOTE_WORKER_GRANTS" in body["message"]
    assert "billing.charge" not in body["message"]
    assert body["errors"] == {
        "operations.1.name": [
            "Operation 'images.resize' is not granted to robo1 (REMOTE_WORKER_GRANTS)."
        ]
    }
    assert_nothing_registered("robo1")
    assert not RemoteOperation.objects.exists()  # not even the granted one


def test_patterns_are_case_sensitive_globs_not_prefixes(grants) -> None:
    grants({"users": {"robo1": grant(["billing.*"], ["billing"])}})
    robo = account("robo1")
    for name in ("billingXcharge", "Billing.charge", "xbilling.charge"):
        assert register(robo, declaration(name, "billing")).status_code == 403, name
    assert register(robo, declaration("billing.a.b", "billing")).status_code == 201


def test_a_group_grant_applies_to_its_members_only(grants) -> None:
    grants({"groups": {"billing-robots": grant(["billing.charge"], ["billing"])}})
    member = account("robo1", groups=("billing-robots", "other"))
    assert register(member, CHARGE).status_code == 201, "a member serves what the group may"
    outsider = account("robo2", groups=("other",))
    body = assert_error_shape(register(outsider, declaration("billing.x", "billing")), 403)
    assert "robo2" in body["message"] and "REMOTE_WORKER_GRANTS" in body["message"]
    assert_nothing_registered("robo2")


def test_user_and_group_grants_add_up(grants) -> None:
    grants(
        {
            "users": {"robo1": grant(["billing.*"], ["billing"])},
            "groups": {"imaging": grant(["images.*"], ["images"])},
        }
    )
    robo = account("robo1", groups=("imaging",))
    response = register(robo, CHARGE, RESIZE)
    assert response.status_code == 201, response.content
    assert sorted(response.json()["queues"]) == ["billing", "images"]


def test_the_grant_is_read_from_the_environment_as_json(monkeypatch) -> None:
    value = {"users": {"robo1": grant(["billing.*"], ["billing"])}}
    monkeypatch.setenv("CONTROLPLANE_REMOTE_WORKER_GRANTS", json.dumps(value))
    robo = account("robo1")
    assert register(robo, CHARGE).status_code == 201
    assert register(robo, RESIZE).status_code == 403


# --- refusals change nothing ------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "queues", "field", "named"),
    [
        ([declaration("images.resize", "billing")], None, "operations.0.name", "images.resize"),
        ([declaration("billing.charge", "payments")], None, "operations.0.queue", "payments"),
        ([CHARGE], ["billing", "payments"], "queues.1", "payments"),
    ],
    ids=["operation", "declared-queue", "served-queue"],
)
def test_a_refused_registration_changes_nothing(
    grants, entries: list[Any], queues: list[str] | None, field: str, named: str
) -> None:
    grants({"users": {"robo1": grant(["billing.*"], ["billing"])}})
    before = Job.objects.count()
    body = assert_error_shape(register(account("robo1"), *entries, queues=queues), 403)
    assert named in body["message"] and "REMOTE_WORKER_GRANTS" in body["message"]
    assert list(body["errors"]) == [field]
    assert not RemoteOperation.objects.exists()
    assert not Worker.objects.exists()
    assert not OperatorAction.objects.exists()
    assert Job.objects.count() == before


def test_a_named_operation_served_on_its_stored_queue_must_be_granted_that_queue(grants) -> None:
    owner = account("robo1")
    assert register(owner, declaration("billing.charge", "payments")).status_code == 201
    grants({"users": {"robo1": grant(["billing.*"], ["billing"])}})
    body = assert_error_shape(register(owner, "billing.charge"), 403)
    assert "'payments'" in body["message"]
    assert Worker.objects.count() == 1  # only the one registered before the grant
    row = RemoteOperation.objects.get()
    assert row.queue == "payments"


# --- claims follow the grant as it reads now ----------------------------------------------


def test_a_narrowed_grant_filters_the_next_claim_of_a_registered_worker(grants) -> None:
    grants({"users": {"robo1": grant(["billing.*"], ["billing", "billing-slow"])}})
    robo = account("robo1")
    response = register(robo, CHARGE, REFUND, queues=["billing", "billing-slow"])
    assert response.status_code == 201, response.content
    worker = response.json()["id"]
    jobs = {
        (op, queue): enqueue(op, {}, queue=queue)
        for op in ("billing.charge", "billing.refund")
        for queue in ("billing", "billing-slow")
    }
    grants({"users": {"robo1": grant(["billing.charge"], ["billing"])}})
    assert [j["id"] for j in claim(robo, worker)] == [str(jobs["billing.charge", "billing"].pk)]
    assert claim(robo, worker) == []
    others = [job.pk for key, job in jobs.items() if key != ("billing.charge", "billing")]
    # Never claimed and put back: the claim's SQL did not ask for them.
    for job in Job.objects.filter(pk__in=others):
        assert (job.status, job.attempts, job.worker_id) == ("queued", 0, None)
    assert not JobEvent.objects.filter(job_id__in=others, event="job.started").exists()
    # Widened again, the same worker takes the rest at its next claim.
    grants({"users": {"robo1": grant(["billing.*"], ["billing*"])}})
    assert {j["id"] for j in claim(robo, worker)} == {str(pk) for pk in others}


def test_a_group_membership_taken_away_stops_the_next_claim(grants) -> None:
    grants({"groups": {"billing-robots": grant(["billing.*"], ["billing"])}})
    robo = account("robo1", groups=("billing-robots",))
    worker = register(robo, CHARGE).json()["id"]
    job = enqueue("billing.charge", {}, queue="billing")
    Token.objects.get().user.groups.clear()  # forgets the cached token and its user
    assert claim(robo, worker) == []
    assert Job.objects.get(pk=job.pk).status == "queued"


def test_an_account_listed_nowhere_serves_nothing(grants) -> None:
    robo = account("robo1")
    worker = register(robo, CHARGE).json()["id"]  # before any allow-list
    job = enqueue("billing.charge", {}, queue="billing")
    grants({"users": {"someone-else": grant(["*"], ["*"])}})
    body = assert_error_shape(register(robo, CHARGE), 403)
    assert "robo1" in body["message"] and "REMOTE_WORKER_GRANTS" in body["message"]
    assert Worker.objects.count() == 1
    assert claim(robo, worker) == []
    assert Job.objects.get(pk=job.pk).status == "queued"


def test_superusers_are_not_exempt(grants) -> None:
    grants({"users": {"robo1": grant(["*"], ["*"])}})
    root = account("root", superuser=True)
    assert_error_shape(register(root, CHARGE), 403)
    assert_nothing_registered("root")
    grants({"users": {"root": grant(["*"], ["*"])}})
    assert register(root, CHARGE).status_code == 201


def test_an_empty_allow_list_serves_nobody(grants) -> None:
    grants({})
    assert_error_shape(register(account("robo1"), CHARGE), 403)
    assert not Worker.objects.exists()


# --- a malformed knob ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ([], "must be an object"),
        ({"robo1": grant(["*"], ["*"])}, "'robo1'"),
        ({"users": []}, "['users'] must map names"),
        ({"users": {"robo1": ["billing.*"]}}, "['users']['robo1'] must be an object"),
        ({"users": {"robo1": {"operations": ["*"]}}}, "missing 'queues'"),
        ({"users": {"robo1": {**grant(["*"], ["*"]), "queue": []}}}, "unknown 'queue'"),
        ({"groups": {"g": grant("billing.*", ["*"])}}, "['groups']['g']['operations']"),
        ({"groups": {"g": grant(["*"], [""])}}, "['groups']['g']['queues']"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_malformed_knob_says_what_is_wrong(grants, value: Any, said: str) -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_grants(value)
    assert said in str(raised.value) and "REMOTE_WORKER_GRANTS" in str(raised.value)
    grants(value)
    [error] = check_grants()
    assert error.id == "controlplane.E010" and said in error.msg
    response = register(account("robo1"), CHARGE)
    body = assert_error_shape(response, 500)
    assert "REMOTE_WORKER_GRANTS" in body["message"]
    assert not Worker.objects.exists() and not RemoteOperation.objects.exists()


def test_a_well_formed_knob_passes_the_check(grants) -> None:
    grants({"users": {"robo1": grant([], [])}, "groups": {"g": grant(["a.*"], ["*"])}})
    assert check_grants() == []
    grants(None)
    assert check_grants() == []


def test_manage_py_check_reports_a_malformed_grants_knob(settings) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.CONTROLPLANE = {**(settings.CONTROLPLANE or {}), "REMOTE_WORKER_GRANTS": {"users": 3}}
    with pytest.raises(SystemCheckError, match="controlplane.E010"):
        call_command("check")
