"""Operations that log and print, loaded by the worker subprocesses of the job-log tests."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

from jobs.operations import JobContext, operation

MODULE = "tests.integration.engine.log_ops"
logger = logging.getLogger("tests.log_ops")


@operation("test.log_and_print")
def log_and_print(ctx: JobContext, payload: dict[str, Any]) -> dict[str, bool]:
    """Logs at every level, prints to stdout and stderr, logs from another thread;
    then waits ``hold`` seconds (live reads) and fails when ``fail`` is set."""
    logger.debug("debug is below the capture level")
    logger.info("first: info")
    print("second: printed")
    logger.warning("third: warning %s", "with args")
    sys.stderr.write("fourth: on stderr\n")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("fifth: error with traceback")
    other = threading.Thread(target=lambda: logger.warning("from another thread"))
    other.start()
    other.join()
    print("sixth: <script>alert('log')</script>")
    print("partial line without newline", end="")
    deadline = time.monotonic() + float(payload.get("hold", 0))
    while time.monotonic() < deadline and not ctx.cancelled:
        time.sleep(0.05)
    if payload.get("fail"):
        raise RuntimeError("failing after logging")
    return {"done": True}


@operation("test.chatty")
def chatty(ctx: JobContext, payload: dict[str, Any]) -> dict[str, int]:
    """Prints ``print_bytes`` bytes (lines of 100) and logs ``log_lines`` lines."""
    line = "x" * 99 + "\n"
    size = int(payload.get("print_bytes", 0))
    if size:
        sys.stdout.write(line * (size // 100))
    for number in range(int(payload.get("log_lines", 0))):
        logger.info("line %d", number)
    return {"ok": 1}
