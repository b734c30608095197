"""Property tests of the REST API: any body gets a 2xx or a 4xx in the one shape.

Enqueue, register, heartbeat, events, complete and fail are fed bodies built
from a valid one by at most one mutation: a field swapped for any JSON value
(hostile text, NaN literals, thousands of levels), a field dropped, an
unknown one added, or a body that is not an object, not JSON, not UTF-8.
They go through Django's test client to the real database. The property is
the contract's: acceptance, or a 4xx ``{"message", "errors"}``, never a 5xx
and never an exception; and a refused report changes nothing on the job.
Runs are derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jobs.models import Job
from tests.factories import claim, queued
from tests.unit.test_properties_payload import ANY_PATTERNS, SAFE_PATTERNS, schemas
from tests.unit.test_properties_storable import DEEP, JSON, TEXT

from .conftest import Api, assert_error_shape, register_worker

pytestmark = pytest.mark.django_db

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# What a well-behaved client sends.
CLEAN = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=12)
NAMES = st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,8})?", fullmatch=True)
CLEAN_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**53), 2**53),
        st.floats(allow_nan=False, allow_infinity=False),
        CLEAN,
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(CLEAN, inner, max_size=3),
    max_leaves=10,
)
# What a hostile one sends instead of a field's value.
HOSTILE = st.one_of(JSON, DEEP, TEXT)
RAW = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"{", b'{"a": NaN}', b'{"a": 1e400}', b"[" * 5000 + b"]" * 5000]),
)


class _Text(str):
    """JSON text already written, waiting on ``_body``'s stack."""


def _body(value: Any, ascii_only: bool) -> bytes:
    """JSON text of ``value``: NaN as the literal, surrogates escaped or sent raw (not UTF-8).

    Written with a loop: Python 3.12's encoder stops near a thousand levels,
    and the deepest bodies here have a few thousand.
    """
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item)
        elif isinstance(item, dict | list):
            parts: list[Any] = [_Text("{" if isinstance(item, dict) else "[")]
            pairs = item.items() if isinstance(item, dict) else ((None, v) for v in item)
            for index, (key, child) in enumerate(pairs):
                if index:
                    parts.append(_Text(","))
                if key is not None:
                    parts.append(_Text(json.dumps(key, ensure_ascii=ascii_only) + ":"))
                parts.append(child)
            parts.append(_Text("}" if isinstance(item, dict) else "]"))
            stack.extend(reversed(parts))
        else:
            out.append(json.dumps(item, ensure_ascii=ascii_only))
    return "".join(out).encode("utf-8", "surrogatepass")


# Values no database stores, wherever a client can put them.
POISON = st.sampled_from(["a\x00b", "\x00", "\ud800", "x\udfff", "\udc80\ud800"])
POISONED = st.one_of(
    POISON,
    POISON.map(lambda text: {"k": text}),
    POISON.map(lambda text: [1, {"k": [text]}]),
    POISON.map(lambda text: {text: 1}),
    st.sampled_from([2**31, -(2**31) - 1, 2**63, 10**30]).map(
        lambda n: {"_progress_current": n, "_progress_total": n, "n": n}
    ),
)


def _nest(depth: int, value: Any) -> Any:
    for _ in range(depth):
        value = {"a": value}
    return value


@st.composite
def mutants(
    draw: st.DrawFn, valid: st.SearchStrategy[dict[str, Any]], focus: tuple[str, ...] = ()
) -> dict[str, Any] | Any:
    """A valid body, or one mutation of it (the mutation is recorded as a hypothesis event).

    Poison goes to the ``focus`` fields when the body has them: the ones
    whose content is stored (a result, an event's fields), not the ones any
    type check already guards.
    """
    body = dict(draw(valid))
    # Half valid, half mutated; poison heads the list, as hypothesis draws the head most.
    mutations = ["poison", "deepen", "poison", "swap", "drop", "unknown", "other"]
    how = draw(st.sampled_from(mutations)) if draw(st.booleans()) else "valid"
    if how in ("poison", "deepen", "swap", "drop") and not body:
        how = "unknown"
    event(f"body: {how}")
    if how == "poison":
        targets = [key for key in focus if key in body] or sorted(body)
        body[draw(st.sampled_from(targets))] = draw(POISONED)
    elif how == "deepen":
        key = draw(st.sampled_from(sorted(body)))
        body[key] = _nest(draw(st.sampled_from([62, 64, 65, 900, 985, 1200, 1489])), body[key])
    elif how == "swap":
        body[draw(st.sampled_from(sorted(body)))] = draw(HOSTILE)
    elif how == "drop":
        del body[draw(st.sampled_from(sorted(body)))]
    elif how == "unknown":
        body[draw(TEXT)] = draw(HOSTILE)
    elif how == "other":
        return draw(HOSTILE)
    return body


def bodies(valid: st.SearchStrategy[dict[str, Any]], *focus: str) -> st.SearchStrategy[bytes]:
    """Encoded mutants, and now and then bytes that are not JSON at all."""
    encoded = st.builds(_body, mutants(valid, focus), st.booleans())
    return st.one_of(encoded, encoded, encoded, encoded, RAW)


def _answered(response: Any, *accepted: int) -> bool:
    """True for an accepted request; a refusal must be a 4xx in the one error shape."""
    event(f"HTTP {response.status_code}")  # the mix shows in --hypothesis-show-statistics
    if response.status_code in accepted:
        return True
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert_error_shape(response, response.status_code)
    return False


# --- enqueue and register ------------------------------------------------------------

OPTIONS = {
    "priority": st.integers(-100, 100),
    "queue": NAMES,
    "max_attempts": st.integers(1, 5),
    "run_after": st.sampled_from(["2000-01-01T00:00:00Z", "2030-01-01T00:00:00+02:00"]),
    "idempotency_key": st.uuids().map(str),
}
ENQUEUES = st.one_of(
    st.fixed_dictionaries({"operation": st.just("ping"), "payload": st.just({})}, optional=OPTIONS),
    st.fixed_dictionaries(
        {
            "operation": st.just("sleep"),
            "payload": st.fixed_dictionaries({"seconds": st.floats(0, 1)}),
        },
        optional=OPTIONS,
    ),
    st.fixed_dictionaries(
        {"operation": st.just("fail"), "payload": st.fixed_dictionaries({"message": CLEAN})},
        optional=OPTIONS,
    ),
)


@PROPERTY
@given(bodies(ENQUEUES, "payload", "queue", "idempotency_key"))
def test_any_enqueue_gets_a_job_or_a_4xx(operator, body):
    before = Job.objects.count()
    if not _answered(operator.post("/jobs", raw=body), 200, 201):
        assert Job.objects.count() == before
    assert operator.get("/jobs").status_code == 200  # and the list still renders


DECLARATIONS = st.one_of(
    st.sampled_from(["ping", "sleep"]),
    st.fixed_dictionaries(
        {"name": st.from_regex(r"p\.[a-z]{1,8}", fullmatch=True)},
        optional={
            "queue": NAMES,
            "payload_schema": schemas(st.sampled_from(SAFE_PATTERNS) | ANY_PATTERNS),
            "max_attempts": st.integers(1, 5),
        },
    ).map(lambda d: {**d, "queue": d.get("queue", "props")}),
)
REGISTRATIONS = st.fixed_dictionaries(
    {
        "operations": st.lists(
            DECLARATIONS,
            min_size=1,
            max_size=3,
            unique_by=lambda op: op if isinstance(op, str) else op["name"],
        )
    },
    optional={
        "name": CLEAN,
        "queues": st.lists(NAMES, max_size=3),
        "concurrency": st.integers(1, 8),
        "hostname": CLEAN,
        "pid": st.integers(0, 99_999),
    },
)


@PROPERTY
@given(bodies(REGISTRATIONS, "operations", "queues", "name", "hostname"))
def test_any_registration_gets_a_worker_or_a_4xx(api_for, body):
    _answered(api_for("remote").post("/workers", raw=body), 201)


# --- reports on a held job ----------------------------------------------------------------


@pytest.fixture
def remote(api_for) -> Api:
    return api_for("remote")


@pytest.fixture
def worker_id(remote: Api) -> str:
    return register_worker(remote)


def _held(worker_id: str) -> tuple[str, str]:
    """A ping job claimed by the remote worker (its account may report on it)."""
    job = queued()
    return str(job.pk), str(claim(job, worker_id=uuid.UUID(worker_id)).lease_token)


def _state(job_id: str) -> tuple[Any, ...]:
    return tuple(
        Job.objects.values_list(
            "status", "last_event_seq", "result", "progress_current", "leased_until"
        ).get(pk=job_id)
    )


TOKEN = "<the lease token>"  # replaced by the held job's token before sending
TOKENS = st.sampled_from([TOKEN, TOKEN, TOKEN, TOKEN, str(uuid.uuid4())])


def _send(body: bytes, job_id: str, token: str) -> bytes:
    return body.replace(TOKEN.encode(), token.encode()).replace(b"<job>", job_id.encode())


EVENTS = st.fixed_dictionaries(
    {
        "lease_token": TOKENS,
        "event": NAMES,
        "fields": st.dictionaries(CLEAN, CLEAN_JSON, max_size=3)
        | st.fixed_dictionaries(
            {}, optional={"_progress_current": st.integers(0, 9), "_progress_total": st.integers(9)}
        ),
    },
    optional={"message": CLEAN, "level": st.sampled_from(["info", "warning", "error"])},
)


@PROPERTY
@given(bodies(EVENTS, "fields", "message", "event"))
def test_any_event_is_written_or_refused_with_nothing_written(remote, worker_id, body):
    job_id, token = _held(worker_id)
    before = _state(job_id)
    response = remote.post(f"/jobs/{job_id}/events", raw=_send(body, job_id, token))
    if not _answered(response, 201):
        assert _state(job_id) == before


REPORTS = st.one_of(
    st.tuples(
        st.just("complete"),
        bodies(
            st.fixed_dictionaries(
                {"lease_token": TOKENS, "result": CLEAN_JSON}, optional={"deferred": st.booleans()}
            ),
            "result",
        ),
    ),
    st.tuples(
        st.just("fail"),
        bodies(
            st.fixed_dictionaries(
                {"lease_token": TOKENS, "error_code": NAMES, "error_message": CLEAN},
                optional={"retryable": st.booleans()},
            ),
            "error_message",
            "error_code",
        ),
    ),
)


@PROPERTY
@given(REPORTS)
def test_any_outcome_is_recorded_or_refused_with_the_job_still_running(remote, worker_id, report):
    route, body = report
    job_id, token = _held(worker_id)
    before = _state(job_id)
    response = remote.post(f"/jobs/{job_id}/{route}", raw=_send(body, job_id, token))
    if _answered(response, 200):
        assert response.json()["status"] in {"succeeded", "running", "failed", "queued"}
    else:
        assert _state(job_id) == before  # still running, seq and result unchanged
        ok = remote.post(f"/jobs/{job_id}/complete", {"lease_token": token, "result": {"ok": 1}})
        assert ok.status_code == 200, ok.content


HEARTBEATS = st.fixed_dictionaries(
    {},
    optional={
        "held": st.none()
        | st.lists(
            st.fixed_dictionaries(
                {
                    "id": st.sampled_from(["<job>", "<job>", str(uuid.uuid4())]),
                    "lease_token": TOKENS,
                }
            ),
            max_size=3,
        )
    },
)


@PROPERTY
@given(bodies(HEARTBEATS, "held"))
def test_any_heartbeat_is_taken_or_refused(remote, worker_id, body):
    job_id, token = _held(worker_id)
    response = remote.request("PATCH", f"/workers/{worker_id}", raw=_send(body, job_id, token))
    _answered(response, 200)
