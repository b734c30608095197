"""Hostile input on the REST API: a 4xx in the one shape, fast.

Each case here would hang or answer a 500 without its guard: a schema regex that backtracks
for minutes (ReDoS), nesting deep enough to exhaust Python's recursion
limit, text no database stores (NUL, lone surrogates) in names, queues,
schemas, event fields and results, integers outside a column's range, and a
heartbeat whose held list holds a null. Nothing may be stored, and a valid
request afterwards must still work.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobs.models import Job, JobEvent, RemoteOperation, Worker
from jobs.storable import MAX_DEPTH

from .conftest import Api, assert_error_shape, claim_one, register_worker

pytestmark = pytest.mark.django_db

EVIL = "^(a+)+$"  # exponential backtracking on "aaa…a!" in a backtracking engine
LONE = "\ud800"  # a lone surrogate: valid JSON ("\\ud800"), not valid Unicode


def _declare(api: Api, schema: Any, *, name: str = "hostile.op", queue: str = "hq") -> Any:
    body = {
        "name": "w",
        "operations": [{"name": name, "queue": queue, "payload_schema": schema}],
    }
    return api.post("/workers", body)


def _nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def _raw_nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _stored() -> tuple[int, int, int, int]:
    return (
        Job.objects.count(),
        JobEvent.objects.count(),
        Worker.objects.count(),
        RemoteOperation.objects.count(),
    )


def _held(job_id: str) -> tuple[Any, ...]:
    return tuple(
        Job.objects.values_list(
            "status", "last_event_seq", "result", "progress_current", "lease_token"
        ).get(pk=job_id)
    )


# --- schema regexes run on RE2; schemas are checked at declaration --------------------


@pytest.mark.timeout(60)
def test_a_backtracking_pattern_answers_at_once(admin, operator):
    """The issue's case: 41 a's and a '!' against ^(a+)+$ ran for over a minute."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "pattern": EVIL}},
        "patternProperties": {"^(x+)+$": {"type": "integer"}},
    }
    assert _declare(admin, schema).status_code == 201
    started = time.monotonic()
    error = assert_error_shape(
        operator.post("/jobs", {"operation": "hostile.op", "payload": {"s": "a" * 41 + "!"}}),
        400,
    )
    assert "payload.s" in error["errors"], error
    key = "x" * 5000 + "!"  # patternProperties do not match it: not an integer needed
    assert (
        operator.post(
            "/jobs", {"operation": "hostile.op", "payload": {"s": "aaaa", key: "text"}}
        ).status_code
        == 201
    )
    assert time.monotonic() - started < 5
    error = assert_error_shape(
        operator.post("/jobs", {"operation": "hostile.op", "payload": {"xxxx": "not a number"}}),
        400,
    )
    assert "payload.xxxx" in error["errors"], error


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "(a)\\1"},  # a backreference
        {"type": "string", "pattern": "(?=a)b"},  # a lookahead
        {"type": "object", "patternProperties": {"(?<!x)y": {}}},  # a lookbehind
        {"type": "string", "pattern": "a{1000}{1000}"},  # too large for RE2
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_at_declaration(admin, schema):
    before = _stored()
    error = assert_error_shape(_declare(admin, schema), 400)
    [messages] = error["errors"].values()
    assert list(error["errors"]) == ["operations.0.payload_schema"], error
    assert "pattern" in messages[0] or "regular expression" in messages[0], messages
    assert _stored() == before


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (_nested(900), "nested"),  # was a RecursionError (500)
        (_nested(MAX_DEPTH + 1), "nested"),
        ({"type": "object", "description": "x" * 70_000}, "bytes"),
        ({"type": 5}, "JSON Schema"),
        ({"$ref": "https://example.com/schema.json"}, "$ref"),
        ({"$ref": "schema.json#/x"}, "$ref"),
        ({"type": "string", "pattern": "a\x00b"}, "NUL"),
        ({"type": "object", "properties": {"a\x00": {}}}, "NUL"),
        ({"type": "string", "description": LONE}, "surrogate"),
        (
            {"patternProperties": {"^a": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties",
        ),
    ],
)
def test_a_schema_out_of_bounds_is_refused_at_declaration(admin, schema, words):
    before = _stored()
    error = assert_error_shape(_declare(admin, schema), 400)
    assert list(error["errors"]) == ["operations.0.payload_schema"], error
    assert words in error["errors"]["operations.0.payload_schema"][0], error
    assert _stored() == before


def test_a_schema_at_the_limits_is_accepted(admin, operator):
    schema = _nested(MAX_DEPTH // 2 - 1, {"type": "integer"})
    assert _declare(admin, {"type": "object", "properties": {"n": schema}}).status_code == 201
    assert (
        operator.post("/jobs", {"operation": "hostile.op", "payload": {"n": 1}}).status_code == 201
    )


def test_a_self_referencing_schema_is_a_400_not_a_500(admin, operator):
    """``{"$ref": "#"}`` recurses without end in any validator: the payload is refused."""
    assert _declare(admin, {"$ref": "#"}).status_code == 201
    error = assert_error_shape(operator.post("/jobs", {"operation": "hostile.op"}), 400)
    assert "payload" in error["errors"], error
    assert not Job.objects.exists()


def test_a_schema_stored_before_these_checks_refuses_its_jobs_with_a_400(operator):
    """A declaration written by an older version (or by hand) is never run on Python's re."""
    RemoteOperation.objects.create(
        name="hostile.legacy",
        queue="hq",
        payload_schema={"properties": {"s": {"pattern": "(a)\\1"}}},
    )
    before = _stored()
    error = assert_error_shape(
        operator.post("/jobs", {"operation": "hostile.legacy", "payload": {"s": "aa"}}), 400
    )
    assert "RE2" in error["errors"]["operation"][0], error
    assert _stored() == before


# --- deep nesting, NUL, lone surrogates, out-of-range integers -------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 985, 1200, 1489])
def test_a_payload_nested_too_deep_is_a_400(admin, operator, depth):
    """985 to 1489 levels passed the JSON parser and broke the storable check (a 500)."""
    assert _declare(admin, {"type": "object"}).status_code == 201
    raw = f'{{"operation": "hostile.op", "payload": {_raw_nested(depth)}}}'
    error = assert_error_shape(operator.post("/jobs", raw=raw), 400)
    # Refused by the payload's depth limit (a field error) or, where the interpreter's
    # stack is shallower (Python 3.12), already by the JSON parser (no field).
    said = " ".join([error["message"], *(m for ms in error["errors"].values() for m in ms)])
    assert "nested" in said, error
    assert all(field.startswith("payload") for field in error["errors"]), error
    assert not Job.objects.exists()


def test_a_payload_at_the_depth_limit_is_accepted(admin, operator):
    assert _declare(admin, {"type": "object"}).status_code == 201
    raw = f'{{"operation": "hostile.op", "payload": {_raw_nested(MAX_DEPTH)}}}'
    assert operator.post("/jobs", raw=raw).status_code == 201


@pytest.mark.parametrize(
    ("operation", "field"),
    [
        ({"name": "a\x00b", "queue": "q", "payload_schema": {}}, "operations.0.name"),
        ({"name": LONE, "queue": "q", "payload_schema": {}}, "operations.0.name"),
        ({"name": "ok.op", "queue": "q\x00", "payload_schema": {}}, "operations.0.queue"),
        ({"name": "ok.op", "queue": LONE, "payload_schema": {}}, "operations.0.queue"),
        (
            {"name": "ok.op", "queue": "q", "payload_schema": {"title": "t\x00"}},
            "operations.0.payload_schema",
        ),
        ("a\x00b", "operations.0.name"),
        (LONE, "operations.0.name"),
    ],
)
def test_register_with_unstorable_text_in_an_operation_is_a_400(admin, operation, field):
    before = _stored()
    error = assert_error_shape(admin.post("/workers", {"operations": [operation]}), 400)
    assert field in error["errors"], error
    assert _stored() == before


@pytest.mark.parametrize(
    "extra",
    [
        {"queues": ["default", "q\x00"]},
        {"queues": [LONE]},
        {"name": LONE},
        {"hostname": "h" + LONE},
        {"pid": 2**31},
        {"pid": -1},
    ],
)
def test_register_with_unstorable_worker_fields_is_a_400(admin, extra):
    before = _stored()
    error = assert_error_shape(admin.post("/workers", {"operations": ["ping"], **extra}), 400)
    assert set(error["errors"]) and all(name.split(".")[0] in extra for name in error["errors"]), (
        error
    )
    assert _stored() == before


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"a\x00": 1}, "fields"),
        ({"a": "b\x00"}, "fields.a"),
        ({"a": [1, {"b": LONE}]}, "fields.a.1.b"),
        ({"_progress_current": 2147483648}, "fields._progress_current"),
        ({"_progress_total": -(2**63)}, "fields._progress_total"),
        ({"_progress_current": -1}, "fields._progress_current"),
        (_nested(MAX_DEPTH + 1), "fields"),
    ],
)
def test_an_event_with_unstorable_fields_is_a_400_and_writes_nothing(admin, fields, field):
    job_id, token = claim_one(admin, register_worker(admin))
    before = _held(job_id), JobEvent.objects.count()
    body = {"lease_token": token, "event": "t.x", "fields": fields}
    error = assert_error_shape(admin.post(f"/jobs/{job_id}/events", body), 400)
    assert any(name.startswith(field) for name in error["errors"]), error
    assert (_held(job_id), JobEvent.objects.count()) == before
    ok = {"lease_token": token, "event": "t.x", "fields": {"_progress_current": 2**31 - 1}}
    assert admin.post(f"/jobs/{job_id}/events", ok).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"event": "t\x00"},
        {"event": "t" + LONE},
        {"event": "t", "message": "m" + LONE},
    ],
)
def test_an_event_with_unstorable_text_is_a_400(admin, body):
    job_id, token = claim_one(admin, register_worker(admin))
    before = _held(job_id)
    response = admin.post(f"/jobs/{job_id}/events", {"lease_token": token, **body})
    assert_error_shape(response, 400)
    assert _held(job_id) == before


@pytest.mark.parametrize(
    "result",
    [
        "a\x00b",
        {"k": "v\x00"},
        {"k\x00": 1},
        LONE,
        {"k": [LONE]},
        {LONE: 1},
        _nested(MAX_DEPTH + 1),
    ],
)
def test_a_complete_with_an_unstorable_result_keeps_the_job_running(admin, result):
    job_id, token = claim_one(admin, register_worker(admin))
    before = _held(job_id)
    response = admin.post(f"/jobs/{job_id}/complete", {"lease_token": token, "result": result})
    error = assert_error_shape(response, 400)
    assert any(name.startswith("result") for name in error["errors"]), error
    assert _held(job_id) == before  # still running, seq unchanged
    response = admin.post(f"/jobs/{job_id}/complete", {"lease_token": token, "result": {"ok": 1}})
    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert Job.objects.get(pk=job_id).result == {"ok": 1}


@pytest.mark.parametrize(
    "body",
    [
        {"error_code": "E" + LONE, "error_message": "m"},
        {"error_code": "E", "error_message": "m" + LONE},
    ],
)
def test_a_fail_with_unstorable_text_keeps_the_job_running(admin, body):
    job_id, token = claim_one(admin, register_worker(admin))
    before = _held(job_id)
    response = admin.post(f"/jobs/{job_id}/fail", {"lease_token": token, **body})
    assert_error_shape(response, 400)
    assert _held(job_id) == before


@pytest.mark.parametrize(
    "held",
    [
        [None],
        [1],
        ["x"],
        [{"id": None, "lease_token": None}],
        {"id": "x"},
    ],
)
def test_a_heartbeat_with_a_malformed_held_list_is_a_400(admin, held):
    worker_id = register_worker(admin)
    job_id, _ = claim_one(admin, worker_id)
    before = Job.objects.values_list("leased_until", flat=True).get(pk=job_id)
    error = assert_error_shape(admin.request("PATCH", f"/workers/{worker_id}", {"held": held}), 400)
    assert all(name.startswith("held") for name in error["errors"]), error
    assert Job.objects.values_list("leased_until", flat=True).get(pk=job_id) == before
    assert admin.request("PATCH", f"/workers/{worker_id}", {"held": []}).status_code == 200
