"""Fixtures for the REST API tests: one user per role, each with a token, and a JSON client.

Roles (the permission matrix):
- ``anonymous``: no credentials
- ``viewer``: controlplane.view_job
- ``operator``: controlplane.view_job, controlplane.change_job, controlplane.add_job
- ``remote``: controlplane.run_remote_jobs only
- ``admin``: a superuser
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from rest_framework.authtoken.models import Token

ROLE_PERMISSIONS = {
    "viewer": ["view_job"],
    "operator": ["view_job", "change_job", "add_job"],
    "remote": ["run_remote_jobs"],
}


class Api:
    """Django's test client speaking JSON, authenticated by a DRF token (or not at all)."""

    def __init__(self, token: str | None = None) -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Token {token}"} if token else {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | str | None = None,
        content_type: str = "application/json",
        **extra: Any,
    ):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.generic(
            method, path, data=data, content_type=content_type, headers=self.headers, **extra
        )

    def get(self, path: str, **params: Any):
        return self.client.get(path, params, headers=self.headers)

    def post(self, path: str, body: Any = None, **kwargs: Any):
        return self.request("POST", path, body, **kwargs)


def make_user(name: str, perms: list[str] | None = None, *, superuser: bool = False) -> User:
    # No password (tokens only): hashing one costs a third of a second.
    if superuser:
        user = User.objects.create_superuser(name, f"{name}@example.com", None)
    else:
        user = User.objects.create_user(name)
    if perms:
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="controlplane", codename__in=perms)
        )
    return user


@pytest.fixture
def api_for(db) -> Callable[[str], Api]:
    """``api_for(role)``: a client for one of the roles above (``"anonymous"`` has no token)."""
    made: dict[str, Api] = {}

    def get(role: str) -> Api:
        if role not in made:
            if role == "anonymous":
                made[role] = Api()
            else:
                user = make_user(role, ROLE_PERMISSIONS.get(role), superuser=role == "admin")
                made[role] = Api(Token.objects.create(user=user).key)
        return made[role]

    return get


@pytest.fixture
def admin(api_for) -> Api:
    return api_for("admin")


@pytest.fixture
def operator(api_for) -> Api:
    return api_for("operator")


@pytest.fixture
def viewer(api_for) -> Api:
    return api_for("viewer")


def assert_error_shape(response, status: int) -> dict[str, Any]:
    """The one error shape: JSON ``{"message": str, "errors": {field: [str]}}``, never HTML."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) == {"message", "errors"}, body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["errors"], dict)
    for messages in body["errors"].values():
        assert isinstance(messages, list) and all(isinstance(m, str) for m in messages)
    return body


# --- the remote-worker protocol, driven through the same client --------------------


@pytest.fixture(autouse=True)
def remote_may_serve_local(settings) -> None:
    """These tests drive the protocol with the built-in ``ping``, which remote workers
    serve only when ``REMOTE_MAY_SERVE_LOCAL`` is set (test_operation_owners checks the
    default)."""
    settings.CONTROLPLANE = {**(settings.CONTROLPLANE or {}), "REMOTE_MAY_SERVE_LOCAL": True}


def register_worker(api: Api, operations: list[str] | None = None) -> str:
    """Register a remote worker for ``operations`` (default ``ping``); return its id."""
    response = api.post("/workers", {"name": "w", "operations": operations or ["ping"]})
    assert response.status_code == 201, response.content
    return response.json()["id"]


def claim_one(api: Api, worker_id: str) -> tuple[str, str]:
    """Enqueue a ping job and claim it over HTTP; return ``(job id, lease token)``."""
    from tests.factories import queued

    job = queued(queue="default")  # the queue of ping, which the worker serves
    response = api.post(f"/workers/{worker_id}/claim", {"limit": 1})
    assert response.status_code == 200, response.content
    [held] = [j for j in response.json()["jobs"] if j["id"] == str(job.pk)]
    return held["id"], held["lease_token"]
