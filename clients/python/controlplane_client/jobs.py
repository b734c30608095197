"""A job as a remote worker holds it, and what an operation may return or raise."""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controlplane_client.api import JobCancelledError, LeaseLostError
from controlplane_client.logs import JobLogBuffer

if TYPE_CHECKING:
    from controlplane_client.manager import JobManager

__all__ = ["ClaimedJob", "Deferred", "RetryableError", "format_traceback"]

# Characters of a traceback sent with a failure: its head and its tail (where
# the raising frame and the exception are) around a marker. The server keeps
# at most 16 KiB of it.
MAX_TRACEBACK_CHARS = 16 * 1024
TRACEBACK_HEAD_CHARS = 4 * 1024


def format_traceback(error: BaseException) -> str:
    """``error``'s formatted traceback, bounded and storable; "" if it was never raised.

    NUL characters and lone surrogates are escaped: the server refuses them,
    and a refused report would leave the job to its lease.
    """
    if error.__traceback__ is None:
        return ""
    try:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    except Exception:  # noqa: BLE001 - the failure is reported without it
        return ""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_TRACEBACK_CHARS:
        omitted = len(text) - MAX_TRACEBACK_CHARS
        marker = f"\n[… {omitted} characters of traceback omitted …]\n"
        tail = MAX_TRACEBACK_CHARS - TRACEBACK_HEAD_CHARS
        text = text[:TRACEBACK_HEAD_CHARS] + marker + text[-tail:]
    return text


@dataclass(frozen=True)
class Deferred:
    """Return this from an operation to leave its job ``running``; ``result`` is stored meanwhile.

    The worker keeps holding the job: its lease token stays valid and the
    manager's heartbeat keeps extending the lease. Finish it later with
    ``manager.complete(job, result)`` or ``manager.fail(job, error)`` (the
    same ``ClaimedJob``; ``manager.held()`` lists them), from any thread, for
    example when an external system calls back. Until then the job counts as
    held: a graceful ``disconnect()`` requeues it, and if the process dies the
    reaper rescues it once the lease expires.
    """

    result: Any = None


class RetryableError(Exception):
    """Raise this (or any exception with ``retryable = True``) for another attempt with backoff.

    ``error_code`` defaults to the exception's class name.
    """

    retryable = True

    def __init__(self, message: str = "", *, error_code: str | None = None) -> None:
        super().__init__(message)
        if error_code:
            self.error_code = error_code


@dataclass(eq=False)
class ClaimedJob:
    """A claimed and started job, held under ``lease_token`` until it is reported.

    ``emit``/``progress`` write to the job's timeline at once. Once the job
    is cancelled or lost (requeued, reaped) they raise ``JobCancelledError``
    or ``LeaseLostError``, and ``cancelled`` turns true (the heartbeat also
    notices it), so a long operation should check it now and then.

    A job with ``timeout_seconds`` counts as cancelled once that long has
    passed since its claim (``lost_reason`` ``"timed_out"``): the server
    fails it with ``JobTimeout`` at the worker's next heartbeat (or the
    reaper does) and records nothing the worker sends about it afterwards.
    """

    id: str
    operation: str
    queue: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    lease_token: str
    parent: str | None = None
    timeout_seconds: float | None = None
    # The enqueuer's trace context ({"traceparent": …}); ``controlplane_client.tracing``
    # continues it as the parent of the run's span.
    trace_context: dict[str, str] | None = None
    _manager: JobManager | None = field(default=None, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    lost_reason: str | None = field(default=None, repr=False)
    # ``time.monotonic()`` at which ``timeout_seconds`` run out (None: no timeout).
    _deadline: float | None = field(default=None, repr=False)
    # The job's unsent log records (``log``), made with the first one.
    _logs: JobLogBuffer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.timeout_seconds and self._deadline is None:
            self._deadline = time.monotonic() + float(self.timeout_seconds)

    @classmethod
    def from_json(cls, data: dict[str, Any], manager: JobManager | None = None) -> ClaimedJob:
        return cls(
            id=str(data["id"]),
            operation=data["operation"],
            queue=data.get("queue", "default"),
            payload=data.get("payload") or {},
            attempt=int(data.get("attempt", data.get("attempts", 1))),
            max_attempts=int(data.get("max_attempts", 1)),
            lease_token=str(data["lease_token"]),
            parent=data.get("parent"),
            timeout_seconds=data.get("timeout_seconds"),
            trace_context=data.get("trace_context"),
            _manager=manager,
        )

    # --- cancellation -------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out or lost: stop working on it."""
        return self._stop.is_set() or self.timed_out

    @property
    def timed_out(self) -> bool:
        """True once ``timeout_seconds`` have passed since the claim."""
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.mark_lost("timed_out")
            return True
        return self.lost_reason == "timed_out"

    def raise_if_cancelled(self) -> None:
        if self.timed_out:
            raise JobCancelledError(409, f"Job {self.id} ran past its timeout; stop working on it.")
        if self.lost_reason == "cancelled":
            raise JobCancelledError(409, f"Job {self.id} was cancelled; stop working on it.")
        if self._stop.is_set():
            raise LeaseLostError(409, f"Job {self.id} is no longer held by this worker.")

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancellation or the job's
        timeout. True if cancelled."""
        if self._deadline is not None:
            timeout = min(timeout, max(self._deadline - time.monotonic(), 0.0))
        return self._stop.wait(timeout) or self.cancelled

    def mark_lost(self, reason: str) -> None:
        self.lost_reason = self.lost_reason or reason
        self._stop.set()

    # --- timeline -------------------------------------------------------------
    def emit(
        self, event: str, message: str | None = None, level: str = "info", **fields: Any
    ) -> int:
        """Append an event to this job's timeline; returns its ``seq``."""
        if self._manager is None:
            raise RuntimeError("This job is not attached to a JobManager.")
        self.raise_if_cancelled()
        return self._manager.emit(self, event, message, level=level, **fields)

    def log(self, level: str, message: str, *, logger: str = "") -> None:
        """Add a record to this job's execution log (``job.log`` events on its timeline).

        ``level``: debug, info, warning, error or critical. Records are sent in
        batches about once a second and before the outcome is reported; the
        server keeps at most its bounds of them (``controlplane_client.logs``).
        """
        if self._logs is None:
            self._logs = JobLogBuffer(self)
        self._logs.add(level, str(message), logger)

    def flush_logs(self) -> None:
        """Send the log records not sent yet (done for you before the outcome)."""
        if self._logs is not None:
            self._logs.flush()

    def progress(self, current: int, total: int | None = None, message: str | None = None) -> int:
        """Move the job's progress bar (a ``job.progress`` event)."""
        fields: dict[str, Any] = {"_progress_current": int(current)}
        if total is not None:
            fields["_progress_total"] = int(total)
        return self.emit("job.progress", message, **fields)
