"""Capture of what an operation logs and prints, per job, onto its timeline.

A worker runs jobs in threads, so capture routes by thread: ``begin`` sets a
context variable to the running job in the job's own thread, and two
routers read it:

- ``JobLogHandler`` on the root logger takes each ``logging`` record at
  ``JOB_LOG_LEVEL`` or above made in a job's thread (the worker's own
  ``workers`` loggers excepted). The record still reaches every other handler
  as before; a record no other handler would have shown (an operation's
  warning with no handler configured) is written to the worker's stderr, as
  Python's last-resort handler did.
- ``StreamRouter`` in place of ``sys.stdout``/``sys.stderr`` takes the lines a
  job's thread writes (``print``) and passes every other write through.

Records from other threads (threads an operation starts included) and from
outside a job go on as if capture did not exist. ``JOB_LOG_ECHO`` False keeps
captured records and prints off the worker's own output.

A job's records are buffered (``JobLog``, made at its first record) and
written in batches through ``jobs.transitions.append_run_events``: every
``JOB_LOG_FLUSH_SECONDS`` by one flusher thread per process (started with the
first record), before the run's outcome is stored (``flush``) and when the run
ends (``end``, which also writes the one ``job.log_truncated`` marker). The
job's thread never waits on a log write while the operation runs, so a chatty
job costs the database at most its bounds (``jobs.job_logs``) and slows only
itself. A job that logs nothing costs a context variable set and reset.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
import uuid
from typing import Any, TextIO

from jobs import transitions
from jobs.claims import ClaimedJob
from jobs.conf import knob
from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED
from jobs.job_logs import (
    SOURCE_LOGGING,
    SOURCE_STDERR,
    SOURCE_STDOUT,
    JobLogBudget,
    LogLimits,
    event_level,
    marker_fields,
    stored_message,
    truncated_marker,
)

log = logging.getLogger("workers")

# The job whose thread this is, while its operation runs.
_current: contextvars.ContextVar[ClaimedJob | None] = contextvars.ContextVar(
    "controlplane_job_log", default=None
)
# Rows per INSERT statement when a buffer is written.
WRITE_CHUNK = 500
# What Python's last-resort handler printed: WARNING and above, when no handler took it.
LAST_RESORT_LEVEL = logging.WARNING
# Records pending in one buffer that wake the flusher before its next tick.
EARLY_FLUSH_RECORDS = 1000


class _Capture:
    """What ``install`` set up, read on every record (module state, one per process)."""

    installed = False
    level = logging.INFO
    echo = True
    flush_seconds = 1.0
    real_stdout: TextIO | None = None
    real_stderr: TextIO | None = None
    handler: JobLogHandler | None = None
    flusher: threading.Thread | None = None
    wake = threading.Event()
    lock = threading.Lock()


_buffers: dict[uuid.UUID, JobLog] = {}


class JobLog:
    """One running job's pending records and what is left of its bounds.

    ``lock`` guards ``pending`` and the budget (held for an append, never
    across a database write); ``write_lock`` keeps two writes of the same
    job (the flusher's, the job thread's) in order.
    """

    def __init__(self, job: ClaimedJob) -> None:
        self.job_id = job.id
        self.lease_token = job.lease_token
        self.limits = LogLimits.current()
        self.budget = JobLogBudget(self.limits)
        self.pending: list[tuple[float, int, str, str, str]] = []
        self.partial = {SOURCE_STDOUT: "", SOURCE_STDERR: ""}
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.marker_written = False

    def add(self, created: float, levelno: int, text: str, logger: str, source: str) -> None:
        message = stored_message(text, self.limits)
        size = len(message.encode("utf-8", "replace"))
        with self.lock:
            if not self.budget.take(size):
                return
            self.pending.append((created, levelno, message, logger, source))
            many = len(self.pending) >= EARLY_FLUSH_RECORDS
        if many:
            _Capture.wake.set()

    def add_text(self, text: str, source: str) -> None:
        """Written text: each complete line one record; an over-long line in pieces."""
        now = time.time()
        levelno = logging.INFO if source == SOURCE_STDOUT else logging.WARNING
        if levelno < _Capture.level:
            return
        if self.budget.truncated:  # the common case of a job printing megabytes: count only
            newlines = text.count("\n")
            with self.lock:
                self.budget.dropped_records += newlines
                self.budget.dropped_bytes += len(text) - newlines
            return
        with self.lock:
            text = self.partial[source] + text
            *lines, rest = text.split("\n")
            cap = max(self.limits.max_message_chars, 1)
            while len(rest) > cap:
                lines.append(rest[:cap])
                rest = rest[cap:]
            self.partial[source] = rest
        for line in lines:
            self.add(now, levelno, line, "", source)

    def take_pending(self, *, final: bool) -> list[transitions.RunEvent]:
        now = time.time()
        with self.lock:
            if final:
                for source, rest in self.partial.items():
                    if rest:
                        self.partial[source] = ""
                        level = logging.INFO if source == SOURCE_STDOUT else logging.WARNING
                        size = len(rest.encode("utf-8", "replace"))
                        if self.budget.take(size):
                            message = stored_message(rest, self.limits)
                            self.pending.append((now, level, message, "", source))
            items, self.pending = self.pending, []
            marker = final and self.budget.truncated and not self.marker_written
            dropped = (self.budget.dropped_records, self.budget.dropped_bytes)
        events = [
            transitions.RunEvent(
                JOB_LOG,
                event_level(levelno),
                message,
                {"logger": logger, "levelname": logging.getLevelName(levelno), "source": source},
                max(now - created, 0.0),
            )
            for created, levelno, message, logger, source in items
        ]
        if marker:
            self.marker_written = True
            record = truncated_marker(*dropped, self.limits)
            events.append(
                transitions.RunEvent(
                    JOB_LOG_TRUNCATED,
                    record.level,
                    record.message,
                    marker_fields(*dropped, self.limits),
                )
            )
        return events

    def write(self, *, final: bool) -> None:
        """Write what is pending; on an error keep it for the next try (the last
        try drops it, with a line in the worker's log)."""
        with self.write_lock:
            events = self.take_pending(final=final)
            for start in range(0, len(events), WRITE_CHUNK):
                chunk = events[start : start + WRITE_CHUNK]
                try:
                    transitions.append_run_events(self.job_id, chunk, lease_token=self.lease_token)
                except Exception as error:  # noqa: BLE001 - logs never break a run
                    rest = events[start:]
                    if final:
                        log.warning(
                            "job.log_write_failed job_id=%s dropped=%d error=%s",
                            self.job_id,
                            len(rest),
                            type(error).__name__,
                        )
                        return
                    with self.lock:
                        self.pending[:0] = [_as_pending(event) for event in rest]
                    return


def _as_pending(event: transitions.RunEvent) -> tuple[float, int, str, str, str]:
    """A taken event back in the pending list (a failed write); the marker is not kept."""
    levelno = logging.getLevelName(event.fields.get("levelname", "INFO"))
    levelno = levelno if isinstance(levelno, int) else logging.INFO
    created = time.time() - event.age
    return (created, levelno, event.message, event.fields.get("logger", ""), event.fields["source"])


def _buffer(job: ClaimedJob) -> JobLog:
    buffer = _buffers.get(job.id)
    if buffer is None:
        with _Capture.lock:
            buffer = _buffers.get(job.id)
            if buffer is None:
                buffer = _buffers[job.id] = JobLog(job)
                _start_flusher()
    return buffer


class JobLogHandler(logging.Handler):
    """Routes the records of a job's thread to that job's buffer (see the module)."""

    _formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        job = _current.get()
        name = record.name
        if name == "workers" or name.startswith("workers."):
            job = None  # the worker's own lines about the run, not the operation's
        try:
            if job is not None:
                text = record.getMessage()
                if record.exc_info:
                    text = f"{text}\n{self._formatter.formatException(record.exc_info)}"
                if record.stack_info:
                    text = f"{text}\n{record.stack_info}"
                _buffer(job).add(record.created, record.levelno, text, name, SOURCE_LOGGING)
                if not _Capture.echo:
                    return
            if record.levelno >= LAST_RESORT_LEVEL and not _shown(record):
                _last_resort(record)
        except Exception:  # noqa: BLE001 - as logging itself: a bad record never stops the caller
            self.handleError(record)


def _last_resort(record: logging.LogRecord) -> None:
    """What Python's last-resort handler did with a record no handler took: its
    message on the real stderr (not through ``StreamRouter``, which would capture it)."""
    stream = _Capture.real_stderr or sys.__stderr__
    if stream is not None:
        stream.write(record.getMessage() + "\n")  # the last resort's format: the message


def _shown(record: logging.LogRecord) -> bool:
    """Whether a handler other than ours sees ``record`` (else Python's last-resort
    handler would have printed it, before capture was installed)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h is not _Capture.handler for h in logger.handlers):
            return True
        logger = logger.parent if logger.propagate else None
    return False


class _NotCaptured(logging.Filter):
    """On the worker's own handlers with ``JOB_LOG_ECHO`` off: drop what a job captured."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _current.get() is None or record.levelno < _Capture.level:
            return True
        return record.name == "workers" or record.name.startswith("workers.")


class StreamRouter:
    """``sys.stdout`` / ``sys.stderr`` in a worker: a job thread's writes go to its log."""

    def __init__(self, real: TextIO, source: str) -> None:
        self._real = real
        self._source = source

    def write(self, text: str) -> int:
        job = _current.get()
        if job is None:
            return self._real.write(text)
        if isinstance(text, str) and text:
            _buffer(job).add_text(text, self._source)
        if _Capture.echo:
            return self._real.write(text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def install() -> bool:
    """Set capture up in this process once (``JOB_LOG_CAPTURE``); True when it is on.

    Lowers the root logger to ``JOB_LOG_LEVEL`` so an operation's INFO records
    exist at all; the handlers already on the root logger keep the level they
    had through it, so the worker's output does not change.
    """
    with _Capture.lock:
        if _Capture.installed:
            return True
        if not knob("JOB_LOG_CAPTURE"):
            return False
        level = logging.getLevelName(str(knob("JOB_LOG_LEVEL")).upper())
        _Capture.level = level if isinstance(level, int) else logging.INFO
        _Capture.echo = bool(knob("JOB_LOG_ECHO"))
        _Capture.flush_seconds = max(float(knob("JOB_LOG_FLUSH_SECONDS")), 0.05)
        root = logging.getLogger()
        if root.level > _Capture.level or root.level == logging.NOTSET:
            before = root.level or logging.WARNING
            for handler in root.handlers:
                if handler.level < before:
                    handler.setLevel(before)
            root.setLevel(_Capture.level)
        if not _Capture.echo:
            for handler in _all_handlers():
                handler.addFilter(_NotCaptured())
        _Capture.handler = JobLogHandler(_Capture.level)
        root.addHandler(_Capture.handler)
        _Capture.real_stdout, _Capture.real_stderr = sys.stdout, sys.stderr
        if sys.stdout is not None:  # None: a process started without one (a daemon)
            sys.stdout = StreamRouter(sys.stdout, SOURCE_STDOUT)
        if sys.stderr is not None:
            sys.stderr = StreamRouter(sys.stderr, SOURCE_STDERR)
        _Capture.installed = True
        return True


def _all_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger()] + [
        value
        for value in logging.Logger.manager.loggerDict.values()
        if isinstance(value, logging.Logger)
    ]
    return list({id(h): h for lg in loggers for h in lg.handlers}.values())


def installed() -> bool:
    return _Capture.installed


def begin(job: ClaimedJob) -> contextvars.Token | None:
    """Route this thread's records and prints to ``job`` until ``end``."""
    if not _Capture.installed:
        return None
    return _current.set(job)


def flush(job: ClaimedJob) -> None:
    """Write what ``job`` logged so far (before its outcome is stored); nothing if it
    logged nothing."""
    buffer = _buffers.get(job.id)
    if buffer is not None:
        buffer.write(final=False)


def end(job: ClaimedJob, token: contextvars.Token | None) -> None:
    """Stop routing; write the rest of ``job``'s log and its truncation marker."""
    if token is None:
        return
    _current.reset(token)
    buffer = _buffers.get(job.id)
    if buffer is None:
        return
    try:
        buffer.write(final=True)
    finally:
        with _Capture.lock:
            if _buffers.get(job.id) is buffer:
                del _buffers[job.id]


def _start_flusher() -> None:
    """The flusher thread, started with the first buffer (under ``_Capture.lock``)."""
    if _Capture.flusher is not None and _Capture.flusher.is_alive():
        return
    _Capture.flusher = threading.Thread(target=_flush_loop, name="job_log_flusher", daemon=True)
    _Capture.flusher.start()


def _flush_loop() -> None:
    from django.db import connection

    while True:
        _Capture.wake.wait(_Capture.flush_seconds)
        _Capture.wake.clear()
        for buffer in list(_buffers.values()):
            try:
                buffer.write(final=False)
            except Exception:  # noqa: BLE001 - the thread outlives any one write
                log.exception("job.log_flush_failed job_id=%s", buffer.job_id)
        if not _buffers:
            connection.close_if_unusable_or_obsolete()
