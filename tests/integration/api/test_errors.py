"""Bad input of every kind gets the one error shape: never HTML, never a traceback."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from jobs import selectors
from jobs.models import Job
from tests.factories import queued

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
    response = operator.client.generic(
        "POST",
        "/jobs",
        raw,
        content_type="application/json",
        headers=operator.headers,
        CONTENT_LENGTH="10",
    )
    assert response.status_code == 400


def test_form_bodies_are_415(operator):
    response = operator.post(
        "/jobs", raw="operation=ping", content_type="application/x-www-form-urlencoded"
    )
    assert_error_shape(response, 415)


def test_unknown_and_malformed_ids_are_404(viewer):
    for path in (
        f"/jobs/{uuid.uuid4()}",
        "/jobs/not-a-uuid",
        "/jobs/12345/",
        "/jobs/%20",
        f"/workers/{uuid.uuid4()}",
        "/workers/zzz",
    ):
        assert_error_shape(viewer.get(path), 404)


def test_unknown_api_paths_are_json_404(viewer, api_for):
    for path in ("/jobs/a/b/c", "/queues/a/b/c", "/workers/a/b/c", f"/jobs/{uuid.uuid4()}/nothing"):
        assert_error_shape(viewer.get(path), 404)
        assert_error_shape(api_for("anonymous").get(path), 404)


def test_wrong_methods_are_405(operator):
    job = queued()
    for method, path in [
        ("DELETE", "/jobs"),
        ("PUT", f"/jobs/{job.pk}"),
        ("GET", "/jobs/cancel"),
        ("GET", f"/jobs/{job.pk}/cancel"),
        ("GET", f"/jobs/{job.pk}/retry/"),
        ("PUT", "/queues"),
        ("DELETE", "/queues/default"),
        ("PUT", "/workers"),
    ]:
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


# --- numbers JSON can carry but no column can hold ------------------------------------
# ``1e400`` (or 400 digits) is inf in Python's json: a 500 on PostgreSQL (jsonb
# refuses it) and, on SQLite, a stored job whose list rendering crashed.
HUGE = "1e400"
DIGITS = "1" + "0" * 400 + ".5"


def _write_routes(api) -> list[tuple[str, str, str, str]]:
    """(method, path, raw body, field) for every route that reads a JSON body."""
    from .conftest import claim_one, register_worker

    worker = register_worker(api)
    job_id, token = claim_one(api, worker)
    failed_job = queued()
    held = f'"lease_token": "{token}"'
    return [
        ("POST", "/jobs", f'{{"operation": "sleep", "payload": {{"seconds": {HUGE}}}}}', "payload"),
        ("POST", "/jobs", f'{{"operation": "ping", "priority": -{HUGE}}}', "priority"),
        ("POST", "/jobs", f'{{"operation": "ping", "payload": {{"a": [1, {DIGITS}]}}}}', "payload"),
        ("POST", f"/jobs/{failed_job.pk}/cancel", f'{{"reason": {HUGE}}}', "reason"),
        ("POST", f"/jobs/{failed_job.pk}/retry", f'{{"reason": {HUGE}}}', "reason"),
        ("POST", "/jobs/cancel", f'{{"queue": [{HUGE}]}}', "queue"),
        ("POST", "/jobs/retry", f'{{"all": true, "ids": [{HUGE}]}}', "ids"),
        ("POST", "/workers", f'{{"operations": ["ping"], "concurrency": {HUGE}}}', "concurrency"),
        ("PATCH", f"/workers/{worker}", f'{{"held": [{{"id": "{job_id}", "x": {HUGE}}}]}}', "held"),
        ("POST", f"/workers/{worker}/claim", f'{{"wait": {HUGE}}}', "wait"),
        (
            "POST",
            f"/jobs/{job_id}/events",
            f'{{{held}, "event": "t", "fields": {{"n": {HUGE}}}}}',
            "fields",
        ),
        ("POST", f"/jobs/{job_id}/complete", f'{{{held}, "result": {{"v": {HUGE}}}}}', "result"),
        (
            "POST",
            f"/jobs/{job_id}/fail",
            f'{{{held}, "error_code": "E", "error_message": "m", "retryable": {HUGE}}}',
            "retryable",
        ),
        ("POST", "/jobs", HUGE, "non_field_errors"),
    ]


def test_non_finite_numbers_are_refused_on_every_write_route(admin):
    from jobs.models import JobEvent, Worker

    routes = _write_routes(admin)
    before = (
        Job.objects.count(),
        Worker.objects.count(),
        JobEvent.objects.count(),
        sorted(Job.objects.values_list("id", "status", "result")),
    )
    for method, path, raw, field in routes:
        error = assert_error_shape(admin.request(method, path, raw=raw), 400)
        assert list(error["errors"]) == [field], (method, path, error)
        assert "finite" in error["errors"][field][0]
    after = (
        Job.objects.count(),
        Worker.objects.count(),
        JobEvent.objects.count(),
        sorted(Job.objects.values_list("id", "status", "result")),
    )
    assert after == before  # nothing stored, nothing changed
    body = admin.get("/jobs").json()  # and the list still renders
    assert len(body["results"]) == before[0]


def test_large_but_finite_numbers_are_stored(operator):
    raw = '{"operation": "fail", "payload": {"message": "m", "extra": 1.5e308}}'
    response = operator.post("/jobs", raw=raw)
    assert response.status_code in (201, 400), response.content  # never a 500
    assert operator.get("/jobs").status_code == 200


# --- timestamps outside what the database can convert --------------------------------

OUT_OF_RANGE = ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59-05:00", "0001-01-01T00:00:00+23:59"]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_out_of_range_timestamps_in_filters_are_400(operator, value):
    queued()
    for name in ("created_after", "created_before"):
        error = assert_error_shape(operator.get("/jobs", **{name: value}), 400)
        assert name in error["errors"] and "9999" in error["errors"][name][0]
        error = assert_error_shape(operator.post("/jobs/cancel", {name: value}), 400)
        assert name in error["errors"]
    encoded = value.replace("+", "%2B")
    response = operator.client.get(f"/jobs?created_after={encoded}", headers=operator.headers)
    assert_error_shape(response, 400)
    assert Job.objects.filter(status="queued").count() == 1


def test_edge_timestamps_that_fit_still_filter(viewer):
    queued()
    for name, value, n in (
        ("created_after", "0001-01-01T00:00:00Z", 1),
        ("created_before", "9999-12-31T00:00:00Z", 1),
        ("created_after", "9999-12-30T23:59:00-05:00", 0),
    ):
        body = viewer.get("/jobs", **{name: value}).json()
        assert len(body["results"]) == n, (name, value, body)


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_out_of_range_timestamp_inside_a_cursor_is_400(viewer, value):
    import base64

    queued()
    token = base64.urlsafe_b64encode(f"{value}|{uuid.uuid4()}".encode()).decode().rstrip("=")
    error = assert_error_shape(viewer.get("/jobs", cursor=token), 400)
    assert "cursor" in error["errors"]


# --- requests Django refuses before (or inside) a view -------------------------------


def test_too_many_query_parameters_is_json_400(viewer, settings):
    query = "&".join(f"f{n}=1" for n in range(1001))
    for debug in (False, True):
        settings.DEBUG = debug
        for path in ("/jobs", "/queues", f"/jobs/{uuid.uuid4()}/events", "/workers"):
            response = viewer.client.get(f"{path}?{query}", headers=viewer.headers)
            error = assert_error_shape(response, 400)
            assert "1000" in error["message"], error
    settings.DEBUG = False
    response = viewer.client.post(
        f"/jobs?{query}", "{}", content_type="application/json", headers=viewer.headers
    )
    assert_error_shape(response, 400)


def test_bad_host_header_is_json_400_for_the_api_and_html_elsewhere(viewer):
    for path in ("/jobs", "/queues/default", "/schema", "/jobs/a/b/c"):
        response = viewer.client.get(path, headers=viewer.headers, HTTP_HOST="evil.example")
        error = assert_error_shape(response, 400)
        assert "Host" in error["message"]
    page = Client().get("/dashboard/", HTTP_HOST="evil.example")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")


def test_unknown_api_paths_stay_json_with_debug_on(viewer, settings, api_for):
    settings.DEBUG = True
    for path in (
        "/jobs/a/b/c",
        f"/jobs/{uuid.uuid4()}/nothing",
        "/queues/a/b/c",
        "/workers/a/b/c",
        "/schema/nothing",
    ):
        assert_error_shape(viewer.get(path), 404)
        assert_error_shape(api_for("anonymous").get(path), 404)
        assert_error_shape(viewer.post(path, {}), 404)
    assert_error_shape(viewer.get(f"/jobs/{uuid.uuid4()}"), 404)
    page = Client().get("/dashboard/no-such-page/")
    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")


def test_permission_denied_outside_a_view_is_json_for_the_api():
    from django.core.exceptions import PermissionDenied
    from django.test import RequestFactory

    from django_controlplane.api.errors import handler403

    response = handler403(RequestFactory().get("/jobs"), PermissionDenied("No."))
    assert response.status_code == 403 and response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {"message": "No.", "errors": {}}
    page = handler403(RequestFactory().get("/dashboard/"), PermissionDenied("No."))
    assert page.status_code == 403 and page["Content-Type"].startswith("text/html")


def test_unknown_query_parameters_are_refused_not_ignored(viewer):
    job = queued()
    # The events take ``after``; the list pages with ``cursor``: each refuses the other's.
    error = assert_error_shape(viewer.get("/jobs?after=3&status=queued"), 400)
    assert "cursor" in error["errors"]["after"][0]
    error = assert_error_shape(viewer.get(f"/jobs/{job.pk}/events?cursor=abc"), 400)
    assert error["errors"]["cursor"] == ["Unknown query parameter; this route takes after, limit."]
    assert_error_shape(viewer.get(f"/jobs/{job.pk}?expand=events"), 400)
    assert_error_shape(viewer.get("/queues?%ED%A0%80%00=1"), 400)
    assert viewer.get(f"/jobs/{job.pk}/events?after=0&limit=5").status_code == 200
    assert viewer.get("/jobs?status=queued&cursor=&limit=5&count=0").status_code == 200


def test_unknown_query_parameters_do_not_tell_anonymous_callers_anything(db):
    assert Client().get("/jobs?bogus=1").status_code in (401, 403)
