"""The payload encoder and id generator of bulk enqueue, without a database."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from jobs.ids import new_job_ids
from jobs.payload_json import dumps as _dumps
from jobs.payload_json import encode_payload as _encode_payload

LIMIT = 1 << 20


def test_job_ids_are_distinct_ascending_version_7_uuids():
    before = time.time_ns() // 1_000_000
    ids = new_job_ids(2000)
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 2000
    assert ids == sorted(ids) and [str(i) for i in ids] == sorted(str(i) for i in ids)
    for value in ids[:200]:
        assert value.version == 7 and value.variant == uuid.RFC_4122
        assert before <= value.int >> 80 <= after  # the millisecond they were made
        again = uuid.UUID(str(value))
        assert again == value and hash(again) == hash(value) and again.int == value.int


@pytest.mark.parametrize(
    "payload",
    [{}, {"a": [1, 2.5, None, True]}, {"é": "ünï", "e": "\U0001f600"}, {"s": "\\u0000"}],
)
def test_storable_payloads_round_trip(payload):
    text, errors = _encode_payload(payload, LIMIT)
    assert errors == {}
    assert json.loads(text) == payload


def test_the_size_limit_counts_utf8_bytes():
    text, errors = _encode_payload({"s": "é" * 10}, 28)
    assert errors == {} and len(text.encode()) == 28
    _, errors = _encode_payload({"s": "é" * 11}, 28)
    assert list(errors) == ["payload"] and "30 bytes" in errors["payload"][0]


@pytest.mark.parametrize(
    "payload,field",
    [
        ({"x": float("nan")}, "payload.x"),
        ({"x": [0, {"y": float("-inf")}]}, "payload.x.1.y"),
        ({"x": "\x00"}, "payload.x"),
        ({"x": "\udfff"}, "payload.x"),
    ],
)
def test_unstorable_payloads_name_the_field(payload, field):
    text, errors = _encode_payload(payload, LIMIT)
    assert text == "" and list(errors) == [field]


def test_a_payload_that_contains_itself_is_refused():
    payload: dict = {}
    payload["me"] = payload
    _, errors = _encode_payload(payload, LIMIT)
    assert "refers to itself" in errors["payload"][0]


def test_the_payload_encoder_recovers_from_a_cycle_and_serves_threads_apart():
    cycle: dict = {}
    cycle["self"] = cycle
    with pytest.raises(ValueError, match="ircular"):
        _dumps(cycle)
    # The encoder is reused: a failure must not leave its containers marked as
    # "being encoded", or the next encoding of them would look circular.
    payload = {"x": [float("nan")]}
    with pytest.raises(ValueError, match="not JSON compliant"):
        _dumps(payload)
    payload["x"] = [1]
    assert _dumps(payload) == '{"x":[1]}'
    shared = {"a": [1, {"b": "é"}]}
    results: list[str] = []

    def encode_many() -> None:
        results.extend(_dumps(shared) for _ in range(2000))

    threads = [threading.Thread(target=encode_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == ['{"a":[1,{"b":"é"}]}'] * 8000
