"""Every mutating operator route of the API writes its audit row (``jobs.audit``).

The same services serve the dashboard (tests/integration/dashboard/test_dash_audited.py),
the admin and the ``jobs`` command, so one action cannot be audited on one face
and silent on another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobs.models import OperatorAction
from tests.factories import failed, queued

from .conftest import Api

pytestmark = pytest.mark.django_db

# (method, path, body) built from a fresh job; the audit action; its target.
Route = Callable[[], tuple[str, str, Any, str]]


def _queued() -> str:
    return str(queued(queue="audited").pk)


def _failed() -> str:
    return str(failed(queue="audited").pk)


ROUTES: dict[str, tuple[Route, str]] = {
    "pause": (lambda: ("POST", "/queues/audited/pause", None, "audited"), "pause"),
    "resume": (lambda: ("POST", "/queues/audited/resume", None, "audited"), "resume"),
    "cap": (
        lambda: ("PATCH", "/queues/audited", {"concurrency_cap": 3}, "audited"),
        "set_cap",
    ),
    "rate": (
        lambda: ("PATCH", "/queues/audited", {"rate_limit_per_second": 2}, "audited"),
        "set_rate_limit",
    ),
    "bulk-cancel": (
        lambda: (_queued() and "POST", "/jobs/cancel", {"queue": "audited"}, "filter"),
        "bulk_cancel",
    ),
    "bulk-retry": (
        lambda: (_failed() and "POST", "/jobs/retry", {"queue": "audited"}, "filter"),
        "bulk_retry",
    ),
    "cancel": (
        lambda: (lambda pk: ("POST", f"/jobs/{pk}/cancel", {"reason": "r"}, pk))(_queued()),
        "cancel",
    ),
    "retry": (
        lambda: (lambda pk: ("POST", f"/jobs/{pk}/retry", {"reason": "r"}, pk))(_failed()),
        "retry",
    ),
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_mutating_operator_route_writes_its_audit_row(route: str, operator: Api) -> None:
    build, action = ROUTES[route]
    method, path, body, target = build()
    before = set(OperatorAction.objects.values_list("pk", flat=True))
    response = operator.request(method, path, body)
    assert response.status_code == 200, response.content
    rows = list(OperatorAction.objects.exclude(pk__in=before))
    assert [(r.action, r.target, r.username) for r in rows] == [(action, target, "operator")]
    assert rows[0].user is not None and rows[0].user.username == "operator"
    if route.startswith("bulk"):
        assert rows[0].count == 1 and rows[0].filter == {"queue": ["audited"]}


def test_a_refused_retry_is_audited_and_still_a_409(operator: Api) -> None:
    pk = _queued()
    assert operator.post(f"/jobs/{pk}/retry", {}).status_code == 409
    row = OperatorAction.objects.get()
    assert (row.action, row.target, row.count) == ("retry", pk, 0)


def test_a_remote_declaration_writes_its_audit_row(api_for) -> None:
    body = {
        "operations": [{"name": "audited.op", "queue": "q", "payload_schema": {"type": "object"}}]
    }
    assert api_for("remote").post("/workers", body).status_code == 201
    row = OperatorAction.objects.get()
    assert (row.action, row.target, row.username) == ("declare_operation", "audited.op", "remote")
