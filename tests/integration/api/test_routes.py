"""Every route of the API, every method it serves, with and without a trailing slash.

Both spellings must give the same status and neither may redirect (docs/rest-api.md).
Each call gets fresh state from its own factory, so a state-changing route
(disconnect, complete) answers the second spelling exactly as the first.
The first test keeps the table honest: a route added to ``django_controlplane.api.urls``
without a row here fails it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.factories import failed, queued

from .conftest import Api, claim_one, register_worker

pytestmark = pytest.mark.django_db

Request = tuple[str, Any]  # (path without a trailing slash, JSON body or None)


def _held(api: Api, suffix: str, body: dict[str, Any]) -> Request:
    job_id, token = claim_one(api, register_worker(api))
    return f"/jobs/{job_id}/{suffix}", {"lease_token": token, **body}


def _schedule() -> str:
    from jobs.schedules.services import create_schedule

    return str(create_schedule({"operation": "ping", "every_seconds": 60}).pk)


def _workflow() -> str:
    from jobs.workflow_specs import start_workflow

    return str(start_workflow({"steps": [{"operation": "ping"}]}).pk)


def _key_limit() -> str:
    from jobs.operator_actions import set_key_limits

    name = f"acct:{uuid.uuid4().hex[:8]}"
    set_key_limits(name, {"concurrency": 1})
    return f"/keys/{name}"


ROUTES: dict[tuple[str, str], tuple[Callable[[Api], Request], int]] = {
    ("job-list", "GET"): (lambda api: ("/jobs", None), 200),
    ("job-list", "POST"): (lambda api: ("/jobs", {"operation": "ping"}), 201),
    ("job-bulk-cancel", "POST"): (lambda api: ("/jobs/cancel", {"all": True}), 200),
    ("job-bulk-retry", "POST"): (lambda api: ("/jobs/retry", {"all": True}), 200),
    ("job-detail", "GET"): (lambda api: (f"/jobs/{queued().pk}", None), 200),
    ("job-events", "GET"): (lambda api: (f"/jobs/{queued().pk}/events", None), 200),
    ("job-events", "POST"): (lambda api: _held(api, "events", {"event": "t.x"}), 201),
    ("job-logs", "GET"): (lambda api: (f"/jobs/{queued().pk}/logs", None), 200),
    ("job-logs", "POST"): (lambda api: _held(api, "logs", {"records": [{"message": "m"}]}), 201),
    ("job-cancel", "POST"): (lambda api: (f"/jobs/{queued().pk}/cancel", None), 200),
    ("job-retry", "POST"): (lambda api: (f"/jobs/{failed().pk}/retry", None), 200),
    ("job-complete", "POST"): (lambda api: _held(api, "complete", {"result": {}}), 200),
    ("job-fail", "POST"): (
        lambda api: _held(api, "fail", {"error_code": "E", "error_message": "m"}),
        200,
    ),
    ("queue-list", "GET"): (lambda api: ("/queues", None), 200),
    ("key-list", "GET"): (lambda api: ("/keys", None), 200),
    ("key-detail", "GET"): (lambda api: (_key_limit(), None), 200),
    ("key-detail", "PATCH"): (lambda api: ("/keys/account:42", {"concurrency": 2}), 200),
    ("key-detail", "DELETE"): (lambda api: (_key_limit(), None), 204),
    ("queue-detail", "GET"): (lambda api: ("/queues/default", None), 200),
    ("queue-detail", "PATCH"): (lambda api: ("/queues/default", {"concurrency_cap": 2}), 200),
    ("queue-pause", "POST"): (lambda api: ("/queues/default/pause", None), 200),
    ("queue-resume", "POST"): (lambda api: ("/queues/default/resume", None), 200),
    ("operation-list", "GET"): (lambda api: ("/operations", None), 200),
    ("worker-list", "GET"): (lambda api: ("/workers", None), 200),
    ("worker-list", "POST"): (lambda api: ("/workers", {"operations": ["ping"]}), 201),
    ("worker-detail", "GET"): (lambda api: (f"/workers/{register_worker(api)}", None), 200),
    ("worker-detail", "PATCH"): (lambda api: (f"/workers/{register_worker(api)}", {}), 200),
    ("worker-detail", "DELETE"): (lambda api: (f"/workers/{register_worker(api)}", None), 200),
    ("worker-claim", "POST"): (
        lambda api: (f"/workers/{register_worker(api)}/claim", {"limit": 1}),
        200,
    ),
    ("schedule-list", "GET"): (lambda api: ("/schedules", None), 200),
    ("schedule-list", "POST"): (
        lambda api: ("/schedules", {"operation": "ping", "every_seconds": 60}),
        201,
    ),
    ("schedule-detail", "GET"): (lambda api: (f"/schedules/{_schedule()}", None), 200),
    ("schedule-detail", "PATCH"): (
        lambda api: (f"/schedules/{_schedule()}", {"priority": 1}),
        200,
    ),
    ("schedule-detail", "DELETE"): (lambda api: (f"/schedules/{_schedule()}", None), 204),
    ("schedule-pause", "POST"): (lambda api: (f"/schedules/{_schedule()}/pause", None), 200),
    ("schedule-resume", "POST"): (lambda api: (f"/schedules/{_schedule()}/resume", None), 200),
    ("schedule-run", "POST"): (lambda api: (f"/schedules/{_schedule()}/run", None), 201),
    ("job-dependencies", "GET"): (lambda api: (f"/jobs/{queued().pk}/dependencies", None), 200),
    ("workflow-list", "GET"): (lambda api: ("/workflows", None), 200),
    ("workflow-list", "POST"): (
        lambda api: ("/workflows", {"steps": [{"operation": "ping"}]}),
        201,
    ),
    ("workflow-detail", "GET"): (lambda api: (f"/workflows/{_workflow()}", None), 200),
    ("workflow-cancel", "POST"): (lambda api: (f"/workflows/{_workflow()}/cancel", None), 200),
    ("metrics", "GET"): (lambda api: ("/metrics", None), 200),
    ("schema", "GET"): (lambda api: ("/schema", None), 200),
    ("schema-docs", "GET"): (lambda api: ("/schema/docs", None), 200),
}

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def _api_patterns(resolver: URLResolver, prefix: str = "") -> list[URLPattern]:
    found = []
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            found += _api_patterns(entry)
        elif entry.name:
            found.append(entry)
    return found


def test_the_table_names_every_route_and_method():
    from django_controlplane.api import urls

    served = set()
    for pattern in _api_patterns(get_resolver(urls)):
        view = pattern.callback.view_class
        served |= {(pattern.name, m.upper()) for m in HTTP_METHODS if hasattr(view, m)}
    assert served == set(ROUTES), served ^ set(ROUTES)


@pytest.mark.parametrize(("name", "method"), sorted(ROUTES))
def test_with_and_without_a_trailing_slash(admin, name, method):
    make, expected = ROUTES[(name, method)]
    statuses = []
    for slash in ("", "/"):
        path, body = make(admin)
        response = admin.request(method, path + slash, body)
        assert not 300 <= response.status_code < 400, (path + slash, response["Location"])
        statuses.append(response.status_code)
        assert response.status_code == expected, (method, path + slash, response.content[:300])
    assert statuses[0] == statuses[1]
