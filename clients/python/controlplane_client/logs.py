"""A remote job's execution log: records buffered per job, sent in batches to
``POST /jobs/<id>/logs``.

``ClaimedJob.log(level, message)`` adds a record; ``JobLogHandler`` on a logger
adds the records made in a job's thread while the auto-serve pool runs it
(``current_job``). A job's records are sent once a second at most, from the
thread that logs, and whatever is left before its outcome is reported, so a
chatty operation makes about one request a second, not one per line. The
server keeps the job's log within its bounds and says when it cut it; from
then on records are only counted here. The client holds at most
``MAX_PENDING`` records per job between two sends, and reports the rest as
dropped.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane_client.jobs import ClaimedJob

__all__ = ["JobLogHandler", "JobLogBuffer", "capture_logging", "current_job"]

log = logging.getLogger("controlplane_client")

# Records held per job between two sends; more are counted as dropped.
MAX_PENDING = 5000
# Records per request (the server takes at most 1000).
SEND_CHUNK = 1000
# Seconds between two sends of one job's records while it runs.
SEND_SECONDS = 1.0
LEVELS = ("debug", "info", "warning", "error", "critical")
# The client's own loggers and its HTTP library's (a line per request, sending
# logs included): never a job's records.
QUIET_LOGGERS = ("controlplane_client", "httpx", "httpcore", "websockets")

# The job the current thread runs (set by the auto-serve pool around a run).
current_job: contextvars.ContextVar[ClaimedJob | None] = contextvars.ContextVar(
    "controlplane_client_job", default=None
)


class JobLogBuffer:
    """One job's unsent records; ``flush`` sends them (the caller's thread)."""

    def __init__(self, job: ClaimedJob) -> None:
        self.job = job
        self.pending: list[dict[str, Any]] = []
        self.dropped_records = 0
        self.dropped_bytes = 0
        self.truncated = False  # the server cut the log: nothing more is sent
        self.last_send = time.monotonic()
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()

    def add(self, level: str, message: str, logger: str = "") -> None:
        level = level.lower()
        if level not in LEVELS:
            raise ValueError(f"The level must be one of {', '.join(LEVELS)}, not {level!r}.")
        with self.lock:
            if self.truncated or len(self.pending) >= MAX_PENDING:
                self.dropped_records += 1
                self.dropped_bytes += len(message.encode("utf-8", "replace"))
                return
            record = {"level": level, "message": message, "logger": logger}
            self.pending.append({**record, "created": time.monotonic()})
            due = time.monotonic() - self.last_send >= SEND_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        """Send what is pending. Errors are logged, never raised: a log never fails a job."""
        with self.send_lock:
            with self.lock:
                items, self.pending = self.pending, []
                dropped = (self.dropped_records, self.dropped_bytes)
                self.dropped_records = self.dropped_bytes = 0
                self.last_send = time.monotonic()
                if self.truncated:
                    return
            if not items and not dropped[0]:
                return
            manager = self.job._manager
            if manager is None:
                return
            now = time.monotonic()
            records = [
                {
                    "level": item["level"],
                    "message": item["message"],
                    "logger": item["logger"],
                    "age": max(now - item["created"], 0.0),
                }
                for item in items
            ]
            chunks = [records[i : i + SEND_CHUNK] for i in range(0, len(records), SEND_CHUNK)]
            for number, chunk in enumerate(chunks or [[]]):
                body: dict[str, Any] = {"lease_token": self.job.lease_token, "records": chunk}
                if number == len(chunks or [[]]) - 1 and dropped[0]:
                    body["dropped_records"], body["dropped_bytes"] = dropped
                try:
                    reply = manager._request("POST", f"/jobs/{self.job.id}/logs", body)
                except Exception as error:  # noqa: BLE001 - logs never fail the job
                    log.warning("job %s: log records not sent: %s", self.job.id, error)
                    return
                if reply.get("truncated"):
                    with self.lock:
                        self.truncated = True
                    return


class JobLogHandler(logging.Handler):
    """Adds the records of a thread running a job (auto-serve) to that job's log.

    Records of other threads pass by. Attach it with ``capture_logging()``.
    """

    def emit(self, record: logging.LogRecord) -> None:
        job = current_job.get()
        if job is None or record.name.startswith(QUIET_LOGGERS):
            return
        try:
            text = record.getMessage()
            if record.exc_info:
                text = f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
            job.log(record.levelname, text, logger=record.name)
        except Exception:  # noqa: BLE001 - as logging itself
            self.handleError(record)


def capture_logging(level: int = logging.INFO) -> JobLogHandler:
    """Send what operations log at ``level`` or above to their jobs' logs: a
    ``JobLogHandler`` on the root logger, which is lowered to ``level`` if needed."""
    handler = JobLogHandler(level)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > level:
        root.setLevel(level)
    return handler
