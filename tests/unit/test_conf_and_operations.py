"""Knobs, payload validation, the registry and JobContext, without a database."""

from __future__ import annotations

import threading
import uuid

import pytest

from jobs.claims import ClaimedJob
from jobs.conf import DEFAULTS, knob
from jobs.exceptions import JobCancelled, RetryLaterError, UnknownOperation
from jobs.operations import (
    JobContext,
    Operation,
    OperationRegistry,
    operation,
    validate_against_schema,
)

CONTRACT_KNOBS = {
    "LEASE_SECONDS",
    "HEARTBEAT_SECONDS",
    "SHUTDOWN_GRACE_SECONDS",
    "POLL_SECONDS",
    "RETRY_BACKOFF_SECONDS",
    "REAPER_INTERVAL_SECONDS",
    "REAPER_TIMEOUT_SECONDS",
    "REAPER_STALL_SECONDS",
    "MAX_LEASE_REQUEUES",
    "WORKER_TIMEOUT_SECONDS",
}


# --- knobs ---------------------------------------------------------------------


def test_every_contract_knob_has_a_default():
    assert CONTRACT_KNOBS <= set(DEFAULTS)


def test_environment_beats_settings_beats_default(settings, monkeypatch):
    monkeypatch.delenv("CONTROLPLANE_LEASE_SECONDS", raising=False)
    assert knob("LEASE_SECONDS") == DEFAULTS["LEASE_SECONDS"]
    settings.CONTROLPLANE = {"LEASE_SECONDS": 12.0}
    assert knob("LEASE_SECONDS") == 12.0
    monkeypatch.setenv("CONTROLPLANE_LEASE_SECONDS", "2.5")
    assert knob("LEASE_SECONDS") == 2.5


@pytest.mark.parametrize(
    "name,raw,expected",
    [
        ("POLL_SECONDS", "0.2", 0.2),
        ("MAX_LEASE_REQUEUES", "4", 4),
        ("MAX_LEASE_REQUEUES", "4.0", 4),
        ("POLL_ONLY", "true", True),
        ("POLL_ONLY", "0", False),
        ("OPERATION_MODULES", "a.b, c.d ,", ["a.b", "c.d"]),
    ],
)
def test_environment_values_are_coerced(monkeypatch, name, raw, expected):
    monkeypatch.setenv(f"CONTROLPLANE_{name}", raw)
    assert knob(name) == expected


def test_unknown_knob_is_a_clear_error():
    with pytest.raises(KeyError, match="Unknown control-plane setting 'NOPE'"):
        knob("NOPE")


# --- payload validation ------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "required": ["seconds"],
    "properties": {
        "seconds": {"type": "number", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "additionalProperties": False,
}


def test_a_valid_payload_has_no_errors():
    assert validate_against_schema({"seconds": 1, "tags": ["a"]}, SCHEMA) == {}


@pytest.mark.parametrize(
    "payload,field",
    [
        ({}, "payload.seconds"),
        ({"seconds": "x"}, "payload.seconds"),
        ({"seconds": -1}, "payload.seconds"),
        ({"seconds": 1, "tags": ["a", 2]}, "payload.tags.1"),
        ({"seconds": 1, "other": True}, "payload"),
        ([], "payload"),
    ],
)
def test_errors_name_the_field(payload, field):
    errors = validate_against_schema(payload, SCHEMA)
    assert field in errors, errors
    assert all(isinstance(m, str) and m for m in errors[field])


# --- the registry ------------------------------------------------------------------


def test_a_private_registry_keeps_its_operations_apart():
    private = OperationRegistry()

    @operation("unit.echo", queue="echoes", max_attempts=2, target=private)
    def echo(ctx, payload):
        """Echoes."""
        return payload

    class Shout(Operation):
        name = "unit.shout"

        def execute(self, ctx, payload):
            return payload["text"].upper()

    private.register(Shout)
    assert private.names() == ["unit.echo", "unit.shout"]
    assert "unit.echo" in private and "unit.missing" not in private
    op = private.get("unit.echo")
    assert (op.queue, op.max_attempts, op.description) == ("echoes", 2, "Echoes.")
    with pytest.raises(UnknownOperation, match="Unknown operation 'unit.missing'"):
        private.get("unit.missing")
    private.unregister("unit.echo")
    assert private.names() == ["unit.shout"]


def test_retryable_errors():
    class Flaky(Operation):
        name = "unit.flaky"
        retryable_exceptions = (TimeoutError,)

    op = Flaky()
    assert op.is_retryable(TimeoutError())
    assert not op.is_retryable(ValueError())
    marked = ValueError("x")
    marked.retryable = True
    assert op.is_retryable(marked)


def test_retry_later_error_carries_its_delay():
    error = RetryLaterError("busy", delay_seconds=5)
    assert (error.reason, error.delay_seconds, str(error)) == ("busy", 5.0, "busy")
    assert "Retry in" in str(RetryLaterError())


# --- JobContext -----------------------------------------------------------------------


def _job() -> ClaimedJob:
    return ClaimedJob(
        id=uuid.uuid4(),
        operation="unit.op",
        queue="default",
        payload={},
        attempt=2,
        max_attempts=3,
        parent_id=None,
        lease_token=uuid.uuid4(),
        expired=False,
    )


def test_context_emit_passes_fields_and_progress():
    calls = []
    ctx = JobContext(_job(), emitter=lambda **kw: calls.append(kw) or len(calls))
    assert ctx.attempt == 2
    assert ctx.emit("unit.step", "hello", level="warning", n=1) == 1
    assert ctx.progress(3, 10) == 2
    assert calls == [
        {"event": "unit.step", "message": "hello", "level": "warning", "fields": {"n": 1}},
        {
            "event": "job.progress",
            "message": None,
            "level": "info",
            "fields": {"_progress_current": 3, "_progress_total": 10},
        },
    ]


def test_context_learns_of_cancellation_from_emit():
    job = _job()

    def emitter(**kw):
        raise JobCancelled(job.id)

    ctx = JobContext(job, emitter=emitter)
    assert not ctx.cancelled
    with pytest.raises(JobCancelled):
        ctx.emit("unit.step")
    assert ctx.cancelled
    with pytest.raises(JobCancelled):
        ctx.raise_if_cancelled()


def test_context_cancel_event_wakes_a_waiting_operation():
    event = threading.Event()
    ctx = JobContext(_job(), emitter=lambda **kw: 1, cancel_event=event)
    assert ctx.wait_cancelled(0.01) is False
    threading.Timer(0.05, event.set).start()
    assert ctx.wait_cancelled(5) is True
    with pytest.raises(JobCancelled):
        ctx.emit("unit.after")
