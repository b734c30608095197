"""A host's outcome receivers, operation hooks and worker class, as the signal tests use them.

Loaded in worker, reaper and test processes: ``install(path)`` connects a
receiver to every outcome signal and registers the ``sig.*`` operations,
each writing one JSON line per call to ``path``. In a subprocess, importing
the module (``OPERATION_MODULES``) installs it when ``SIGNAL_LOG`` names
the file; ``SIGNAL_RAISE=1`` also connects a receiver that raises first.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from django.db import connection

from jobs import signals
from jobs.operations import Operation, operation, registry
from workers.engine import JobWorker
from workers.holding import NotNow

LOG_ENV = "SIGNAL_LOG"
RAISE_ENV = "SIGNAL_RAISE"
HOLD_ENV = "SIGNAL_HOLD_SECONDS"
HOLD_REASON = "maintenance window <b>'db upgrade'</b>"

SIGNALS = {
    "job_succeeded": signals.job_succeeded,
    "job_failed": signals.job_failed,
    "job_cancelled": signals.job_cancelled,
    "job_retry_scheduled": signals.job_retry_scheduled,
    "job_retry_later": signals.job_retry_later,
    "job_requeued": signals.job_requeued,
    "job_retried": signals.job_retried,
}

_log_path: Path | None = None


def record(kind: str, **fields: Any) -> None:
    """Append one JSON line to the log (whole lines: O_APPEND keeps processes apart)."""
    if _log_path is None:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **fields}, default=str) + "\n"
    fd = os.open(_log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _receiver(name: str):
    def receive(sender: Any, outcome: signals.JobOutcome, **kwargs: Any) -> None:
        from jobs.models import Job

        record(
            name,
            job_id=str(kwargs["job_id"]),
            operation=kwargs["operation"],
            queue=kwargs["queue"],
            status=kwargs["status"],
            attempt=kwargs["attempt"],
            event=kwargs["event"],
            error_code=kwargs["error_code"],
            result=kwargs["result"],
            by=kwargs["fields"].get("by"),
            in_atomic=connection.in_atomic_block,
            # What the database holds by now: the change, committed.
            stored=Job.objects.filter(pk=outcome.job_id).values_list("status", flat=True).first(),
        )

    receive.__name__ = f"record_{name}"
    return receive


def _raise(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("a receiver that breaks")


_RECEIVERS = {name: _receiver(name) for name in SIGNALS}


# --- operations with outcome hooks -----------------------------------------------


def _on_success(outcome: signals.JobOutcome, result: Any) -> None:
    record("hook.on_success", job_id=str(outcome.job_id), op=outcome.operation, result=result)


def _on_failure(outcome: signals.JobOutcome, error: signals.JobError) -> None:
    record(
        "hook.on_failure",
        job_id=str(outcome.job_id),
        op=outcome.operation,
        code=error.code,
        message=error.message,
    )


def sig_ok(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Succeeds with its payload's ``n``."""
    return {"n": payload.get("n")}


def sig_fail(ctx: Any, payload: dict[str, Any]) -> None:
    """Fails with a retryable ValueError on every attempt."""
    raise ValueError("boom")


def sig_hooked(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Succeeds, or fails when the payload says ``fail``; its hooks record both."""
    if payload.get("fail"):
        raise RuntimeError("hooked failure")
    return {"hooked": True}


class HookedOperation(Operation):
    """The hooks as methods of an ``Operation`` subclass; ``on_success`` raises when asked."""

    name = "sig.hooked_class"

    def execute(self, ctx: Any, payload: dict[str, Any]) -> Any:
        if payload.get("fail"):
            raise RuntimeError("class failure")
        return {"cls": True, "hook_raises": bool(payload.get("hook_raises"))}

    def on_success(self, outcome: signals.JobOutcome, result: Any) -> None:
        record("hook.class_success", job_id=str(outcome.job_id), result=result)
        if result.get("hook_raises"):
            raise RuntimeError("a hook that breaks")

    def on_failure(self, outcome: signals.JobOutcome, error: signals.JobError) -> None:
        record("hook.class_failure", job_id=str(outcome.job_id), code=error.code)


OPERATIONS = ("sig.ok", "sig.fail", "sig.hooked", "sig.hooked_class")


def install(path: Path | str, *, raising: bool = False) -> None:
    """Connect the recording receivers (a raising one first, if asked) and register the ops."""
    global _log_path
    _log_path = Path(path)
    if raising:
        for signal in SIGNALS.values():
            signal.connect(_raise, dispatch_uid="tests.signal_app.raise")
    for name, signal in SIGNALS.items():
        signal.connect(_RECEIVERS[name], dispatch_uid=f"tests.signal_app.{name}")
    operation("sig.ok")(sig_ok)
    operation("sig.fail", max_attempts=2, retryable_exceptions=(ValueError,))(sig_fail)
    operation("sig.hooked", on_success=_on_success, on_failure=_on_failure)(sig_hooked)
    registry.register(HookedOperation)


def uninstall() -> None:
    global _log_path
    for name, signal in SIGNALS.items():
        signal.disconnect(dispatch_uid=f"tests.signal_app.{name}")
        signal.disconnect(dispatch_uid="tests.signal_app.raise")
    for name in OPERATIONS:
        registry.unregister(name)
    _log_path = None


# --- a host's worker class -----------------------------------------------------------


class HoldingWorker(JobWorker):
    """Says "not now" for ``SIGNAL_HOLD_SECONDS`` on its first ``pre_dequeue``, then claims."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held = False

    def pre_dequeue(self) -> bool | NotNow:
        if not self.held:
            self.held = True
            seconds = float(os.environ.get(HOLD_ENV, "2"))
            record("hold", at=time.time(), seconds=seconds, worker_id=str(self.id))
            return NotNow(seconds, HOLD_REASON)
        return True


class NotAWorker:
    """Not a ``JobWorker``: a ``WORKER_CLASS`` naming it is refused."""


if os.environ.get(LOG_ENV):
    install(os.environ[LOG_ENV], raising=os.environ.get(RAISE_ENV) == "1")
