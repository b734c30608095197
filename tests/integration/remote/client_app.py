"""A remote worker for the tests: the real client, in its own process, without Django.

    python client_app.py --url URL --token KEY [--mode auto|manual] [--no-websocket]
                         [--long-poll S] [--polling-interval S] [--concurrency N] [--count N]
                         [--drop-pushes]

Prints ``READY <worker id>`` once registered and ``DONE <job id> <status>``
per job reported (manual mode), so tests can wait on its output.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any

from controlplane_client import (
    ClaimedJob,
    Deferred,
    JobManager,
    RetryableError,
    TokenApi,
    capture_logging,
)

SCHEMA_TEXT = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}


def echo(job: ClaimedJob) -> Any:
    job.progress(1, 1, "echoed")
    return {"echo": job.payload["text"], "attempt": job.attempt}


def slow(job: ClaimedJob) -> Any:
    seconds = float(job.payload.get("seconds", 1.0))
    steps = max(1, int(seconds / 0.1))
    for step in range(steps):
        if job.wait_cancelled(seconds / steps):
            return None  # cancelled or lost: the report will be refused anyway
        job.progress(step + 1, steps)
    return {"slept": seconds}


def flaky(job: ClaimedJob) -> Any:
    if job.attempt < 2:
        raise RetryableError("first attempt always fails", error_code="Flaky")
    return {"attempt": job.attempt}


def deferred(job: ClaimedJob) -> Any:
    """Hand the job to "something external" that finishes it later (``finish_after`` s)."""
    finish_after = job.payload.get("finish_after")
    if finish_after is not None:

        def finish() -> None:
            assert MANAGER is not None and job in MANAGER.held()
            status = MANAGER.complete(job, {"final": True})
            print("FINISHED", job.id, status, flush=True)

        threading.Timer(float(finish_after), finish).start()
    return Deferred({"partial": True})


def broken(job: ClaimedJob) -> Any:
    if job.payload.get("unserialisable"):
        return {"when": object()}
    raise ValueError("broken on purpose")


def logs(job: ClaimedJob) -> Any:
    """Logs through ``logging`` (captured with --capture-logs) and ``job.log``."""
    logging.getLogger("remote.ops").info("via logging <b>%s</b>", job.payload.get("tag", ""))
    logging.getLogger("remote.ops").warning("a warning")
    for number in range(int(job.payload.get("lines", 0))):
        job.log("info", f"line {number}", logger="remote.ops")
    job.log("error", "via job.log")
    return {"logged": True}


MANAGER: JobManager | None = None

HANDLERS = {
    "remote.echo": (echo, {"payload_schema": SCHEMA_TEXT, "max_attempts": 3}),
    "remote.slow": (slow, {}),
    "remote.flaky": (flaky, {"max_attempts": 3}),
    "remote.deferred": (deferred, {}),
    "remote.broken": (broken, {}),
    "remote.logs": (logs, {}),
}


def drop_pushes(manager: JobManager) -> None:
    """Lose every push on the floor while keeping the socket open: only polling is left."""
    push = manager._push
    assert push is not None, "--drop-pushes needs the websocket"

    def dropped() -> None:
        print("PUSH DROPPED", flush=True)

    push.on_available = dropped
    if push.connected.wait(10):
        print("PUSH UP", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--mode", choices=["auto", "manual"], default="auto")
    parser.add_argument("--no-websocket", action="store_true")
    parser.add_argument("--long-poll", type=float, default=10.0)
    parser.add_argument("--polling-interval", type=float, default=None)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--count", type=int, default=1, help="manual mode: jobs to handle")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument(
        "--drop-pushes", action="store_true", help="ignore every push (the socket stays up)"
    )
    parser.add_argument("--capture-logs", action="store_true", help="capture_logging()")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(threadName)s %(message)s")
    assert "django" not in sys.modules, "the client must not need Django"
    if args.capture_logs:
        capture_logging()

    api = TokenApi(args.url, token=lambda: args.token)  # a callable: refreshed on every request
    manager = JobManager(
        api,
        name="test-client",
        concurrency=args.concurrency,
        websocket=not args.no_websocket,
        long_poll=args.long_poll,
        polling_interval=args.polling_interval,
        shutdown_grace=args.grace,
    )
    global MANAGER
    MANAGER = manager
    with manager:
        if args.mode == "auto":
            for name, (handler, definition) in HANDLERS.items():
                manager.operation(name, queue="remote", **definition)(handler)
            print("READY", manager.connect(), flush=True)
            if args.drop_pushes:
                drop_pushes(manager)
            manager.wait()
            print("STOPPED", flush=True)
            return 0
        for name, (_, definition) in HANDLERS.items():
            manager.declare(name, queue="remote", **definition)
        print("READY", manager.connect(), flush=True)
        done = 0
        for job in manager.listen():
            manager.start(job)
            try:
                status = manager.complete(job, HANDLERS[job.operation][0](job))
            except Exception as error:  # noqa: BLE001
                status = manager.fail(job, error)
            print("DONE", job.id, status, flush=True)
            done += 1
            if done >= args.count:
                break
        time.sleep(0.1)
    print("STOPPED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
