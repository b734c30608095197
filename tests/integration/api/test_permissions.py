"""The permission matrix: who may call which route, by token and by session."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from jobs.models import Job, Worker
from tests.factories import failed, queued

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db

VIEW, ADD, CHANGE, REMOTE, ANY = "view", "add", "change", "remote", "any"
# What each role holds (anonymous holds nothing; admin everything).
HOLDS = {
    "anonymous": set(),
    "viewer": {VIEW, ANY},
    "operator": {VIEW, ADD, CHANGE, ANY},
    "remote": {REMOTE, ANY},
    "admin": {VIEW, ADD, CHANGE, REMOTE, ANY},
}
ROUTES = [
    ("GET", "/jobs", None, VIEW),
    ("POST", "/jobs", {"operation": "ping"}, ADD),
    ("GET", "/jobs/{job}", None, VIEW),
    ("GET", "/jobs/{job}/events", None, VIEW),
    ("POST", "/jobs/{job}/cancel", None, CHANGE),
    ("POST", "/jobs/{failed}/retry", None, CHANGE),
    ("POST", "/jobs/cancel", {"ids": ["{job}"]}, CHANGE),
    ("POST", "/jobs/retry", {"ids": ["{failed}"]}, CHANGE),
    ("GET", "/queues", None, VIEW),
    ("GET", "/queues/default", None, VIEW),
    ("POST", "/queues/default/pause", None, CHANGE),
    ("POST", "/queues/default/resume", None, CHANGE),
    ("PATCH", "/queues/default", {"rate_limit_per_second": 5}, CHANGE),
    ("GET", "/operations", None, VIEW),
    ("GET", "/workers", None, VIEW),
    ("GET", "/workers/{worker}", None, VIEW),
    ("GET", "/schema", None, ANY),
    ("POST", "/workers", {"name": "r", "queues": ["default"], "operations": ["ping"]}, REMOTE),
    ("PATCH", "/workers/{worker}", {}, REMOTE),
    ("DELETE", "/workers/{worker}", None, REMOTE),
    ("POST", "/jobs/{job}/events", {"lease_token": "{token}", "event": "x.y"}, REMOTE),
]


def _fill(value, names):
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    return value


@pytest.mark.parametrize("role", list(HOLDS))
def test_permission_matrix(api_for, role):
    api = api_for(role)
    for method, path, body, needs in ROUTES:
        names = {
            "job": queued().pk,
            "failed": failed().pk,
            "worker": Worker.objects.create(name="w", kind="remote").pk,
            "token": uuid.uuid4(),
        }
        url = _fill(path, names)
        response = api.request(method, url, _fill(body, names))
        label = f"{role} {method} {url}"
        if needs in HOLDS[role]:
            assert response.status_code not in (401, 403), (label, response.content[:300])
            assert response.status_code < 500, (label, response.content[:300])
        else:
            expected = 401 if role == "anonymous" else 403
            body = assert_error_shape(response, expected)
            assert body["errors"] == {}, label
            if expected == 401:
                assert response["WWW-Authenticate"] == "Token"


def test_denied_callers_change_nothing(api_for):
    job = queued()
    for role in ("anonymous", "viewer", "remote"):
        api = api_for(role)
        api.post(f"/jobs/{job.pk}/cancel")
        api.post("/jobs/cancel", {"all": True})
        api.post("/jobs", {"operation": "ping"})
    assert list(Job.objects.values_list("status", flat=True)) == ["queued"]


def test_a_bad_token_is_401(db):
    client = Client()
    response = client.get("/jobs", headers={"Authorization": "Token not-a-real-token"})
    assert_error_shape(response, 401)


def test_session_auth_reads_and_needs_csrf_to_write(db):
    user = User.objects.create_superuser("sess", "s@example.com", None)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/jobs").status_code == 200
    job = queued()
    refused = client.post(f"/jobs/{job.pk}/cancel", "{}", content_type="application/json")
    assert_error_shape(refused, 403)
    client.get("/accounts/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    accepted = client.post(
        f"/jobs/{job.pk}/cancel",
        "{}",
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert accepted.status_code == 200 and accepted.json()["status"] == "cancelled"


def test_drf_create_token_command_makes_a_working_token(db):
    from io import StringIO

    from django.core.management import call_command

    User.objects.create_superuser("cli", "c@example.com", None)
    out = StringIO()
    call_command("drf_create_token", "cli", stdout=out)
    key = out.getvalue().split()[2]
    response = Client().get("/jobs", headers={"Authorization": f"Token {key}"})
    assert response.status_code == 200
