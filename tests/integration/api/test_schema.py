"""/schema (OpenAPI 3), /schema/docs (Swagger UI, assets served locally), and a schemathesis run."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.core.wsgi import get_wsgi_application
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from rest_framework.authtoken.models import Token

from .conftest import assert_error_shape

CONTRACT_ROUTES = {
    ("get", "/jobs"),
    ("post", "/jobs"),
    ("get", "/jobs/{job_id}"),
    ("get", "/jobs/{job_id}/events"),
    ("post", "/jobs/{job_id}/cancel"),
    ("post", "/jobs/{job_id}/retry"),
    ("post", "/jobs/cancel"),
    ("post", "/jobs/retry"),
    ("get", "/queues"),
    ("post", "/queues/{name}/pause"),
    ("post", "/queues/{name}/resume"),
    ("get", "/operations"),
    ("get", "/workers"),
    ("get", "/workers/{worker_id}"),
    # The remote-worker protocol.
    ("post", "/workers"),
    ("patch", "/workers/{worker_id}"),
    ("delete", "/workers/{worker_id}"),
    ("post", "/workers/{worker_id}/claim"),
    ("post", "/jobs/{job_id}/events"),
    ("post", "/jobs/{job_id}/complete"),
    ("post", "/jobs/{job_id}/fail"),
}


@pytest.mark.django_db
def test_schema_describes_every_route_once_without_trailing_slashes(viewer):
    response = viewer.get("/schema")
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.")
    routes = {(m, p) for p, ops in doc["paths"].items() for m in ops if m != "parameters"}
    assert CONTRACT_ROUTES <= routes, CONTRACT_ROUTES - routes
    assert not [p for p in doc["paths"] if p.endswith("/")]
    enqueue = doc["paths"]["/jobs"]["post"]
    assert "requestBody" in enqueue and {"201", "400"} <= set(enqueue["responses"])
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method != "parameters":
                assert any(code.startswith("2") for code in op["responses"]), (method, path)
    assert {"tokenAuth", "cookieAuth"} <= set(doc["components"]["securitySchemes"])
    assert viewer.get("/schema/", format="yaml").content.startswith(b"openapi: 3")


@pytest.mark.django_db
def test_schema_needs_authentication(api_for):
    assert_error_shape(api_for("anonymous").get("/schema"), 401)


@pytest.mark.django_db
def test_docs_page_uses_local_assets_and_asks_anonymous_users_to_sign_in(db):
    anonymous = Client().get("/schema/docs")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    client = Client()
    client.force_login(User.objects.create_user("reader"))
    page = client.get("/schema/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "//cdn" not in html and "https://" not in html.split("<body")[0]
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css")


# --- schemathesis ---------------------------------------------------------------------
# Every route, the remote-worker protocol included, is fuzzed from the schema
# through Django's WSGI app with a superuser token (it holds every permission).
# No answer may be a 5xx, and every answer whose status the schema documents
# must match the documented body and content type. Claims may long-poll: the
# generated ``wait`` is cut to WAIT_CAP so the run does not sit in long-polls.
MAX_EXAMPLES = 15
SECONDS_PER_OPERATION = 1.5
WAIT_CAP = 0.05


def cap_wait(case) -> None:
    """The hook that keeps a fuzzed claim from long-polling for up to 30 s."""
    body = case.body
    if (
        isinstance(body, dict)
        and isinstance(body.get("wait"), (int, float))
        and not isinstance(body.get("wait"), bool)
    ):
        body["wait"] = max(0.0, min(float(body["wait"]), WAIT_CAP))


def fuzz(operation, headers: dict[str, str], statuses: Counter[int], failures: list[str]) -> None:
    """Send up to MAX_EXAMPLES valid and invalid cases of one operation; record what fails."""
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
    )

    checks = [not_a_server_error, response_schema_conformance, content_type_conformance]
    deadline = time.monotonic() + SECONDS_PER_OPERATION

    @given(
        case=operation.as_strategy(GenerationMode.POSITIVE)
        | operation.as_strategy(GenerationMode.NEGATIVE)
    )
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        if time.monotonic() > deadline:
            return
        cap_wait(case)
        response = case.call(headers=headers)
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except (AssertionError, BaseExceptionGroup) as error:  # a Failure or a FailureGroup
            failures.append(
                f"{case.method} {case.formatted_path} -> {response.status_code}: {str(error)[:400]}"
            )
            return
        if response.status_code >= 400:
            body = response.json()
            assert set(body) == {"message", "errors"}, body

    run()


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_errors_and_answers_match_the_schema():
    import schemathesis

    user = User.objects.create_superuser("fuzz", "f@example.com", None)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    schema = schemathesis.openapi.from_wsgi("/schema", get_wsgi_application(), headers=headers)
    failures: list[str] = []
    statuses: Counter[int] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    remote = [op for op in operations if "remote workers" in (op.tags or [])]
    for operation in operations:
        fuzz(operation, headers, statuses, failures)
    assert len(operations) >= 20 and len(remote) >= 7, [op.label for op in operations]
    assert not failures, "\n".join(failures)
    assert statuses[200] and statuses[400], statuses
    assert sum(statuses.values()) >= 5 * len(operations), statuses
