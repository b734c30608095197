"""Diagnostic operations shipped with the product (docs/configuration.md, "Diagnostic operations").

They let an operator smoke-test a deployment and let tests drive every path
of the engine through the public surface.
"""

from __future__ import annotations

import time
from typing import Any

from jobs.batches import BatchOperation, batch_registry, dispatch_batches
from jobs.events import JOB_RETRY_LATER
from jobs.models import JobEvent
from jobs.operations import JobContext, OperationResult, operation


class DiagnosticFailure(Exception):
    """The error the ``fail`` operation raises on purpose."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@operation("ping", payload_schema={"type": "object", "additionalProperties": False})
def ping(ctx: JobContext, payload: dict[str, Any]) -> dict[str, bool]:
    """Returns {"pong": true}."""
    return {"pong": True}


@operation(
    "sleep",
    payload_schema={
        "type": "object",
        "required": ["seconds"],
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "maximum": 86400},
            "emit_every": {"type": "number", "exclusiveMinimum": 0},
        },
        "additionalProperties": False,
    },
)
def sleep(ctx: JobContext, payload: dict[str, Any]) -> dict[str, float]:
    """Sleeps, emitting sleep.tick with progress; stops early when cancelled."""
    seconds = float(payload["seconds"])
    every = float(payload.get("emit_every") or max(seconds / 10, 0.05))
    ticks = max(1, int(seconds / every + 0.999)) if seconds else 0
    started = time.monotonic()
    for tick in range(1, ticks + 1):
        remaining = started + min(tick * every, seconds) - time.monotonic()
        if remaining > 0 and ctx.wait_cancelled(remaining):
            ctx.raise_if_cancelled()
        ctx.emit("sleep.tick", None, _progress_current=tick, _progress_total=ticks)
    return {"slept": round(time.monotonic() - started, 3)}


@operation(
    "fail",
    max_attempts=3,
    payload_schema={
        "type": "object",
        # Payload: {"message": str, "retryable": bool?}
        "required": ["message"],
        "properties": {"message": {"type": "string"}, "retryable": {"type": "boolean"}},
        "additionalProperties": False,
    },
)
def fail(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Raises DiagnosticFailure(message); retried with backoff when retryable."""
    raise DiagnosticFailure(payload["message"], payload.get("retryable", False))


@operation(
    "retry_later",
    payload_schema={
        "type": "object",
        # Payload: {"times": int, "delay": float}, both required.
        "required": ["times", "delay"],
        "properties": {
            "times": {"type": "integer", "minimum": 0, "maximum": 1000},
            "delay": {"type": "number", "minimum": 0, "maximum": 86400},
        },
        "additionalProperties": False,
    },
)
def retry_later(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    """Raises RetryLaterError the first `times` runs, then succeeds."""
    from jobs.exceptions import RetryLaterError

    done = JobEvent.objects.filter(job_id=ctx.job_id, event=JOB_RETRY_LATER).count()
    if done < payload["times"]:
        raise RetryLaterError(f"retry {done + 1} of {payload['times']}", payload["delay"])
    return {"retried": done}


@operation(
    "fanout",
    payload_schema={
        "type": "object",
        "required": ["batches"],
        "properties": {
            "batches": {"type": "integer", "minimum": 1, "maximum": 100000},
            "batch_sleep": {"type": "number", "minimum": 0, "maximum": 3600},
            "fail_batch": {"type": "integer", "minimum": 0},
        },
        "additionalProperties": False,
    },
)
def fanout(ctx: JobContext, payload: dict[str, Any]) -> OperationResult:
    """Coordinator: dispatches `batches` messages to <queue>.batch and returns deferred."""
    n = payload["batches"]
    dispatch_batches(
        ctx,
        operation="fanout.batch",
        payloads=[
            {
                "index": i,
                "sleep": payload.get("batch_sleep", 0.0),
                "fail": payload.get("fail_batch") == i,
            }
            for i in range(n)
        ],
    )
    return OperationResult(result={"batches": n}, deferred=True)


@batch_registry.register
class FanoutBatch(BatchOperation):
    name = "fanout.batch"
    payload_schema = {
        "type": "object",
        "required": ["index"],
        "properties": {
            "index": {"type": "integer"},
            "sleep": {"type": "number"},
            "fail": {"type": "boolean"},
        },
    }

    def process(self, payload: dict[str, Any]) -> dict[str, Any]:
        if payload.get("sleep"):
            time.sleep(payload["sleep"])
        if payload.get("fail"):
            raise DiagnosticFailure(f"batch {payload['index']} failed on purpose")
        return {"index": payload["index"], "square": payload["index"] ** 2}
