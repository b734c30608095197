"""Bad input of every kind gets the one error shape: never HTML, never a traceback."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from jobs import selectors
from jobs.models import Job
from tests.integration.foundation.helpers import queued

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def test_malformed_json(operator):
    error = assert_error_shape(operator.post("/jobs", raw='{"operation": "ping",'), 400)
    assert "JSON" in error["message"]
    assert_error_shape(operator.post("/jobs", raw=b"\xff\xfe not utf-8"), 400)
    assert_error_shape(operator.post("/jobs", raw='{"operation": NaN}'), 400)


def test_json_nested_too_deep(operator):
    assert_error_shape(operator.post("/jobs", raw="[" * 100_000 + "]" * 100_000), 400)


def test_body_that_is_not_an_object(operator):
    job = queued()
    for raw in ("[]", "[1]", '"ping"', "42", "null", '""'):
        error = assert_error_shape(operator.post("/jobs", raw=raw), 400)
        assert "object" in error["errors"]["non_field_errors"][0]
        assert_error_shape(operator.post(f"/jobs/{job.pk}/cancel", raw=raw), 400)
        assert_error_shape(operator.post("/jobs/retry", raw=raw), 400)
    assert operator.post(f"/jobs/{job.pk}/cancel").status_code == 200  # no body at all is fine


def test_oversized_body_is_413(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    body = {"operation": "sleep", "payload": {"seconds": 1, "pad": "x" * 5000}}
    error = assert_error_shape(operator.post("/jobs", body), 413)
    assert "2000" in error["message"]
    assert not Job.objects.exists()
    job = queued()
    assert_error_shape(operator.post(f"/jobs/{job.pk}/cancel", {"reason": "r" * 5000}), 413)
    assert_error_shape(operator.post("/jobs/cancel", {"q": "q" * 5000}), 413)
    assert operator.post("/jobs", {"operation": "ping"}).status_code == 201


def test_body_larger_than_its_declared_length_is_cut_at_the_limit(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    raw = json.dumps({"operation": "ping", "pad": "x" * 5000})
    response = operator.client.generic("POST", "/jobs", raw, content_type="application/json",
                                       headers=operator.headers, CONTENT_LENGTH="10")
    assert response.status_code == 400


def test_form_bodies_are_415(operator):
    response = operator.post(
        "/jobs", raw="operation=ping", content_type="application/x-www-form-urlencoded"
    )
    assert_error_shape(response, 415)


def test_unknown_and_malformed_ids_are_404(viewer):
    for path in (f"/jobs/{uuid.uuid4()}", "/jobs/not-a-uuid", "/jobs/12345/", "/jobs/%20",
                 f"/workers/{uuid.uuid4()}", "/workers/zzz"):
        assert_error_shape(viewer.get(path), 404)


def test_unknown_api_paths_are_json_404(viewer, api_for):
    for path in ("/jobs/a/b/c", "/queues/a/b/c", "/workers/a/b/c", f"/jobs/{uuid.uuid4()}/nothing"):
        assert_error_shape(viewer.get(path), 404)
        assert_error_shape(api_for("anonymous").get(path), 404)


def test_wrong_methods_are_405(operator):
    job = queued()
    for method, path in [("DELETE", "/jobs"), ("PUT", f"/jobs/{job.pk}"), ("GET", "/jobs/cancel"),
                         ("GET", f"/jobs/{job.pk}/cancel"), ("GET", f"/jobs/{job.pk}/retry/"),
                         ("PUT", "/queues"), ("DELETE", "/queues/default"), ("PUT", "/workers")]:
        response = operator.request(method, path)
        error = assert_error_shape(response, 405)
        assert method in error["message"]


def test_unexpected_errors_are_json_500_without_a_traceback(viewer, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(selectors, "queue_stats", broken)
    client = Client(raise_request_exception=False)
    response = client.get("/queues", headers=viewer.headers)
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"message", "errors"}
    assert b"secret internal detail" not in response.content
    assert b"Traceback" not in response.content


@pytest.mark.parametrize("path", ["/jobs", "/queues", "/workers", "/schema"])
def test_every_route_answers_with_and_without_a_trailing_slash(viewer, path):
    plain, slashed = viewer.get(path), viewer.get(path + "/")
    assert plain.status_code == slashed.status_code == 200


def test_trailing_slash_variants_of_item_routes(operator):
    job = queued()
    for path in (f"/jobs/{job.pk}", f"/jobs/{job.pk}/events", "/queues/default"):
        assert operator.get(path).status_code == 200
        assert operator.get(path + "/").status_code == 200
    assert operator.post(f"/jobs/{job.pk}/cancel/").status_code == 200
    assert operator.post("/queues/default/pause/").status_code == 200
    assert operator.post("/queues/default/resume").status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("GET", "/jobs?q=a%00b", None, "q"),
        ("GET", "/jobs?queue=a%00b", None, "queue"),
        ("GET", "/jobs?operation=a%00b", None, "operation"),
        ("POST", "/jobs", {"operation": "fail", "payload": {"message": "a\u0000b"}}, "payload"),
        ("POST", "/jobs", {"operation": "ping", "queue": "a\u0000"}, "queue"),
        ("POST", "/jobs", {"operation": "ping", "idempotency_key": "a\u0000"}, "idempotency_key"),
        ("POST", "/jobs/cancel", {"queue": "a\u0000"}, "queue"),
        ("POST", "/queues/a%00b/pause", None, "name"),
        ("GET", "/queues/a%00b", None, "name"),
        ("POST", "/jobs", '{"operation": "fail", "payload": {"message": "\\ud800"}}', "payload"),
        ("POST", "/jobs", '{"operation": "\\udfff"}', "operation"),
        ("POST", "/jobs/cancel", '{"queue": ["\\ud800"]}', "queue"),
        ("POST", "/jobs/retry", '{"q": "\\ud800"}', "q"),
    ],
)
def test_unstorable_text_is_refused_before_it_reaches_the_database(
    admin, method, path, body, field
):
    """NUL (PostgreSQL) and lone surrogates (any driver): a 400 naming the field, not a 500."""
    raw = body if isinstance(body, str) else None
    error = assert_error_shape(admin.request(method, path, body, raw=raw), 400)
    assert field in error["errors"], error
    assert admin.get("/jobs").status_code == 200  # the transaction is still usable


def test_huge_after_reads_as_nothing_new_and_last_seq_stays_real(viewer):
    job = queued()
    body = viewer.get(f"/jobs/{job.pk}/events", after=10**20).json()
    assert body["results"] == [] and body["last_seq"] == 1  # job.enqueued, not 10**20
