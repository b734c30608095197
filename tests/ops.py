"""Operations used only by tests (loaded in worker subprocesses via OPERATION_MODULES)."""

import os
import time

from jobs.operations import Operation, OperationResult, operation, registry


@operation("test.crash")
def crash(ctx, payload):
    """Kills its own process, like a segfault or an OOM kill would."""
    os._exit(int(payload.get("code", 1)))


class AtomicWrite(Operation):
    """Writes an event row in its own transaction, then fails or succeeds."""

    name = "test.atomic"
    atomic = True

    def execute(self, ctx, payload):
        from jobs.models import Queue

        Queue.objects.create(name=payload["queue_name"])
        ctx.emit("atomic.wrote", queue=payload["queue_name"])
        if payload.get("fail"):
            raise RuntimeError("atomic failure")
        return {"ok": True}


registry.register(AtomicWrite)


@operation("test.returns")
def returns(ctx, payload):
    """Returns what the payload describes: a NUL, a NaN, or a plain value."""
    kind = payload.get("kind")
    if kind == "nul":
        return {"text": "a\x00b"}
    if kind == "nan":
        return {"ratio": float("nan")}
    if kind == "emit_nul":
        ctx.emit("test.bad", "a\x00b")
    if kind == "deep":  # deeper than json.dumps can recurse
        deep: list = []
        for _ in range(5000):
            deep = [deep]
        return {"deep": deep}
    return {"ok": True}


@operation("test.db_outage")
def db_outage(ctx, payload):
    """Fails like a dropped database connection on its first run, then succeeds."""
    from django.db import OperationalError

    from jobs.models import JobEvent

    if not JobEvent.objects.filter(job_id=ctx.job_id, event="job.retry_later").exists():
        raise OperationalError("server closed the connection unexpectedly")
    return {"ok": True}


@operation("test.defer_after")
def defer_after(ctx, payload):
    """Waits without touching the database, then stays running as a deferred job."""
    time.sleep(float(payload.get("seconds", 1)))
    return OperationResult(result={"deferred": True}, deferred=True)


class ExactlyOnce(Operation):
    """The chaos tests' side effect: one ``OperatorAction`` row, committed with the success.

    It emits first (that event commits at once, on its own connection), then
    sleeps inside its transaction so that ``kill -9`` and
    ``pg_terminate_backend`` land mid-transaction. A run cut short leaves no
    row behind, and a run whose lease was lost cannot commit its row either:
    the success transition in the same transaction is fenced by the lease
    token. So a job that succeeded owns exactly one row whatever the chaos;
    two rows would mean the operation's effects committed twice.
    """

    name = "test.exactly_once"
    atomic = True

    def execute(self, ctx, payload):
        from jobs.models import OperatorAction

        ctx.emit("exactly_once.began", attempt=ctx.attempt)
        OperatorAction.objects.create(action="chaos.side_effect", target=str(ctx.job_id))
        time.sleep(float(payload.get("seconds", 0)))
        return {"wrote": True}


registry.register(ExactlyOnce)


@operation("test.stubborn_sleep")
def stubborn_sleep(ctx, payload):
    """Never looks at its context: waits for the file ``release`` (at most ``seconds``),
    then writes "returned" to ``marker`` and returns a result."""
    from pathlib import Path

    release = Path(payload["release"])
    deadline = time.monotonic() + float(payload.get("seconds", 30))
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    Path(payload["marker"]).write_text("returned")
    return {"late": True}


@operation("test.cooperative_sleep", timeout_seconds=0.5)
def cooperative_sleep(ctx, payload):
    """Sleeps until cancelled (at most ``seconds``); writes to ``marker`` what it then saw:
    ``cancelled=True emit=JobCancelled`` when its context told it to stop."""
    from pathlib import Path

    from jobs.exceptions import JobCancelled

    ctx.wait_cancelled(float(payload.get("seconds", 30)))
    try:
        ctx.emit("cooperative.after")
        emitted = "written"
    except JobCancelled:
        emitted = "JobCancelled"
    Path(payload["marker"]).write_text(f"cancelled={ctx.cancelled} emit={emitted}")
    return {"stopped": ctx.cancelled}
