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


# Values a result, a progress report or an error message may not hold,
# and the documented conversions a result may use.
POISON_BIG = 2 * 1024 * 1024  # past MAX_RESULT_BYTES, MAX_ERROR_MESSAGE_CHARS, MAX_EVENT_...


@operation("test.poison")
def poison(ctx, payload):
    """Returns, reports or raises what ``payload["kind"]`` names."""
    import datetime
    import decimal
    import uuid

    kind = payload["kind"]
    if kind == "progress_nan":
        return OperationResult(result={"ok": True}, progress_current=float("nan"))
    if kind == "progress_huge":
        return OperationResult(result={"ok": True}, progress_current=10**12)
    if kind == "progress_over_total":
        return OperationResult(result={"ok": True}, progress_current=15, progress_total=10)
    if kind == "ctx_progress_negative":
        ctx.progress(-5, 10)
        return {"ok": True}
    if kind == "system_exit":
        raise SystemExit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt
    if kind == "object":
        return {"thing": object()}
    if kind == "set":
        return {"tags": {"a", "b"}}
    if kind == "big_result":
        return {"blob": "x" * POISON_BIG}
    if kind == "big_error":
        raise RuntimeError("e" * POISON_BIG)
    if kind == "big_event":
        ctx.emit("test.big", "m" * POISON_BIG)
        return {"ok": True}
    if kind == "documented":
        return {
            "when": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
            "day": datetime.date(2026, 1, 2),
            "id": uuid.UUID(int=7),
            "amount": decimal.Decimal("12.50"),
        }
    raise AssertionError(f"unknown kind {kind!r}")
