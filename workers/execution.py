"""Session 2 of the two-session pattern: run one claimed job and record its outcome.

The claim (session 1) committed ``running`` + ``job.started`` + the lease
before we get here. Nothing here holds a transaction open while the
operation runs, unless the operation asked for atomic execution. Every
write is fenced by the lease token: a job that was cancelled or taken over
meanwhile is left as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, transaction

from jobs import transitions
from jobs.claims import ClaimedJob, Completion
from jobs.conf import knob
from jobs.exceptions import (
    ControlPlaneError,
    JobCancelled,
    LeaseLost,
    RetryLaterError,
    UnknownOperation,
    UnstorableValue,
)
from jobs.failures import format_traceback, innermost_frame
from jobs.independent import independent_connection
from jobs.logging_json import state_line_level
from jobs.operations import JobContext, Operation, OperationRegistry, OperationResult
from jobs.retry_policy import (
    EXPONENTIAL,
    RETRY_LATER_LIMIT,
    RetryPolicy,
    global_policy,
    resolved_policy,
    stored_override,
)
from jobs.states import FAILED
from jobs.storable import (
    InvalidProgress,
    ResultTooLarge,
    check_event_message,
    checked_progress,
    storable_json,
    text_problem,
)
from jobs.tracing import end_run, run_span
from workers import log_capture
from workers.resilience import describe, is_outage, reset_connection, with_db_retry

log = logging.getLogger("workers")


# Why a flight's ``cancel`` was set, when the worker itself set it: the run's
# log line then says what happened instead of ``job.cancelled``.
STOP_SHUTDOWN = "shutdown"
STOP_TIMEOUT = "timeout"


@dataclass
class InFlight:
    job: ClaimedJob
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    # Set before ``cancel`` by the worker (``STOP_SHUTDOWN``, ``STOP_TIMEOUT``);
    # empty when an operator's cancel or a lost lease stopped the run.
    stop_reason: str = ""
    # Per-job timeouts (``workers.timeouts``): the monotonic deadline, the
    # thread running it, and what the worker did about it. ``done`` and
    # ``abandoned`` change under the worker's lock only.
    deadline: float | None = None
    thread_id: int | None = None
    timed_out: bool = False
    done: bool = False
    abandoned: float = 0.0  # when the worker gave up on the run (monotonic); 0: it did not

    def __post_init__(self) -> None:
        if self.job.timeout_seconds:
            self.deadline = self.started + self.job.timeout_seconds


@dataclass(frozen=True)
class Outcome:
    """What happened to a run; ``completion`` is set when success awaits a batched write."""

    status: str
    completion: Completion | None = None
    error: BaseException | None = None
    # What a failure recorded (``failed``, ``retry_scheduled``): the worker's log line says it.
    error_code: str = ""
    error_message: str = ""


# The worker's log level per outcome; INFO for the rest.
_LOG_LEVELS = {
    "succeeded": logging.DEBUG,
    "failed": logging.WARNING,
    "retry_scheduled": logging.WARNING,
}
# Characters of an error message a log line carries (the event keeps all of it).
LOG_MESSAGE_CHARS = 500


def _log_detail(flight: InFlight, outcome: Outcome) -> str:
    """The end of a run's log line: why it stopped, or what the failure was."""
    if outcome.status == "stopped":
        return f" reason={flight.stop_reason}"
    if outcome.error_code or outcome.error_message:
        # repr keeps the line one line whatever the message holds (newlines, escapes).
        message = outcome.error_message[:LOG_MESSAGE_CHARS]
        return f" error={outcome.error_code} message={message!r}"
    return ""


def _log_fields(flight: InFlight, outcome: Outcome, duration_ms: int) -> dict[str, Any]:
    """A run's log line as data, for JSON logs (``jobs.logging_json``)."""
    job = flight.job
    fields: dict[str, Any] = {
        "job_id": str(job.id),
        "operation": job.operation,
        "queue": job.queue,
        "attempt": job.attempt,
        "duration_ms": duration_ms,
        "status": outcome.status,
    }
    if outcome.status == "stopped":
        fields["reason"] = flight.stop_reason
    if outcome.error_code or outcome.error_message:
        fields["error_code"] = outcome.error_code
        fields["error"] = outcome.error_message[:LOG_MESSAGE_CHARS]
    return fields


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff from ``base``, capped, with the knobs' jitter (``RETRY_JITTER``).

    The worker's own delays (an outage requeue); a job's retries follow its
    ``RetryPolicy`` (``JobRunner._handle_error``).
    """
    policy = RetryPolicy(backoff_seconds=base, backoff_max_seconds=cap, strategy=EXPONENTIAL)
    return policy.over(global_policy()).delay(attempt)


def _json_safe(value: Any, what: str) -> Any:
    """``value`` as the database will store it, or ``UnstorableValue`` saying why not.

    Checked here, per job, because a completion is written in a batch with
    others: one NUL in one result must fail that job, not the whole batch.
    Only JSON and the conversions ``storable_json`` documents are taken (a
    set or any other object is refused, never stringified); at most
    ``MAX_RESULT_BYTES`` (``ResultTooLarge``).
    """
    if value is None or type(value) is int or type(value) is bool:
        return value  # the common results: nothing to convert, measure or read settings for
    return storable_json(value, what, max_bytes=int(knob("MAX_RESULT_BYTES")))


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _stops_worker(error: BaseException) -> bool:
    """Whether ``error`` is the worker's own stop, to let through rather than fail the job.

    Signals reach Python in the main thread only, so a ``KeyboardInterrupt``
    or ``SystemExit`` raised in a job's thread is the operation's own doing
    (``sys.exit()``, ``raise SystemExit``): that job's failure. In the main
    thread (an operation run inline) they keep their meaning.
    """
    return isinstance(error, (KeyboardInterrupt, SystemExit)) and _in_main_thread()


def _error_text(error: BaseException) -> str:
    """An error's message as recorded; a non-``Exception`` says what it did not do."""
    text = str(error) or type(error).__name__
    if not isinstance(error, Exception):
        text = (
            f"The operation raised {type(error).__name__}({text}); it failed this job "
            "and did not stop the worker."
        )
    return text


def _emitter(job: ClaimedJob) -> Callable[..., int]:
    """``emit`` for an operation: visible at once, even inside the operation's own transaction."""

    def emit(*, event: str, message: str | None, level: str, fields: dict[str, Any]) -> int:
        for name, text in (("event name", event), ("message", message or "")):
            if reason := text_problem(text):
                raise UnstorableValue(f"The {name} {reason}.")
        check_event_message(message or "")
        kwargs = dict(
            event=event,
            message=message,
            level=level,
            fields=_json_safe(fields, "event's fields"),
            lease_token=job.lease_token,
        )
        if connection.in_atomic_block and connection.vendor == "postgresql":
            with independent_connection() as alias:
                return transitions.emit_event(job.id, using=alias, **kwargs)
        return transitions.emit_event(job.id, **kwargs)

    return emit


class JobRunner:
    """Runs claimed jobs; one instance per worker, called from its pool threads."""

    def __init__(
        self,
        registry: OperationRegistry,
        *,
        retry_backoff_seconds: float,
        retry_backoff_max_seconds: float,
        max_outage_requeues: int = 3,
        pre_handle: Callable[[ClaimedJob], None] | None = None,
        post_handle: Callable[[ClaimedJob, str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.retry_backoff_seconds = retry_backoff_seconds
        self.retry_backoff_max_seconds = retry_backoff_max_seconds
        self.max_outage_requeues = max_outage_requeues
        self.pre_handle = pre_handle
        self.post_handle = post_handle

    def run(self, flight: InFlight) -> Outcome:
        """Run one claimed job inside its ``controlplane.run`` span (``jobs.tracing``).

        The span's parent is the enqueuer's stored context; it ends with the
        run's outcome, before a batched success is written.
        """
        with run_span(flight.job) as span:
            outcome = self._run_and_log(flight)
            if span is not None:
                end_run(
                    span, outcome.status, outcome.error, outcome.error_code, outcome.error_message
                )
            return outcome

    def _run_and_log(self, flight: InFlight) -> Outcome:
        job = flight.job
        try:
            outcome = self._run(flight)
        except BaseException as error:  # noqa: BLE001 - last line of defence: never stuck in running
            if _stops_worker(error):
                raise
            outcome = self._last_resort(flight, error)
        if outcome.status == "cancelled" and flight.stop_reason:
            # The worker stopped the run, nobody cancelled the job: the worker's
            # own line (``job.requeued`` …) says what became of it.
            outcome = Outcome("stopped", error=outcome.error)
        # Per-job success lines are DEBUG (CONTROLPLANE_LOG_LEVEL=DEBUG shows them):
        # at thousands of jobs a second they were half the worker's CPU, and the
        # events table records every transition anyway. Failures are WARNING and
        # say what failed (the traceback is on the job's event); others stay INFO.
        # With JSON logs (LOG_FORMAT=json) every outcome is INFO or above, with its fields.
        level = state_line_level(_LOG_LEVELS.get(outcome.status, logging.INFO))
        if log.isEnabledFor(level):
            duration_ms = int((time.monotonic() - flight.started) * 1000)
            log.log(
                level,
                "job.%s job_id=%s operation=%s queue=%s attempt=%d duration_ms=%d%s",
                outcome.status,
                job.id,
                job.operation,
                job.queue,
                job.attempt,
                duration_ms,
                _log_detail(flight, outcome),
                extra={"controlplane": _log_fields(flight, outcome, duration_ms)},
            )
        if self.post_handle is not None:
            try:
                self.post_handle(job, outcome.status)
            except Exception:  # noqa: BLE001 - hooks must not break the worker
                log.exception("hook.post_handle_failed job_id=%s", job.id)
        return outcome

    def _last_resort(self, flight: InFlight, error: BaseException) -> Outcome:
        """An error outside the operation (the cancel check, a hook): record it somehow."""
        job = flight.job
        if is_outage(error):
            try:
                return self._requeue_after_outage(flight, error)
            except Exception:  # noqa: BLE001 - fall through to a fresh connection
                pass
        log.error("job.record_failed job_id=%s", job.id, exc_info=error)
        return self._fail_fresh(
            job, "WorkerError", f"{type(error).__name__}: {_error_text(error)}", error=error
        )

    def _run(self, flight: InFlight) -> Outcome:
        job = flight.job
        if job.expired:
            return self._fail(flight, "JobExpired", "The job expired before a worker could run it.")
        try:
            op = self.registry.get(job.operation)
        except UnknownOperation:
            return self._fail(
                flight,
                "UnknownOperation",
                f"No operation named {job.operation!r} is registered on this worker.",
            )
        if job.parent_id and transitions.has_cancelled_ancestor(job.id):
            transitions.cancel_jobs([job.id], reason="parent cancelled before the child ran")
            return Outcome("cancelled")
        ctx = JobContext(job, emitter=_emitter(job), cancel_event=flight.cancel)
        # What the operation logs and prints from here on goes to the job's log
        # (``workers.log_capture``): written before the outcome is stored, and
        # its rest (the ``after`` hook's) when the run ends.
        capture = log_capture.begin(job)
        try:
            if self.pre_handle is not None:
                self.pre_handle(job)
            try:
                op.before(ctx)
                if op.atomic:
                    return self._run_atomic(op, ctx, flight)
                value = op.execute(ctx, job.payload)
            except BaseException as error:  # noqa: BLE001
                log_capture.flush(job)
                outcome = self._handle_error(op, flight, error)
                self._after(op, ctx, outcome)
                return outcome
            log_capture.flush(job)
            outcome = self._handle_value(op, flight, value, atomic=False)
            self._after(op, ctx, outcome)
            return outcome
        finally:
            log_capture.end(job, capture)

    def _run_atomic(self, op: Operation, ctx: JobContext, flight: InFlight) -> Outcome:
        """The operation's writes commit with the success transition, or not at all."""
        try:
            with transaction.atomic():
                value = op.execute(ctx, flight.job.payload)
                outcome = self._handle_value(op, flight, value, atomic=True)
        except BaseException as error:  # noqa: BLE001
            if _stops_worker(error):
                raise
            outcome = self._handle_error(op, flight, error)
        self._after(op, ctx, outcome)
        return outcome

    def _after(self, op: Operation, ctx: JobContext, outcome: Outcome) -> None:
        try:
            op.after(ctx, outcome.status, outcome.error)
        except BaseException as error:  # noqa: BLE001 - a hook's SystemExit too
            if _stops_worker(error):
                raise
            log.error("hook.after_failed job_id=%s", ctx.job_id, exc_info=error)

    def _handle_value(
        self, op: Operation, flight: InFlight, value: Any, *, atomic: bool
    ) -> Outcome:
        job = flight.job
        result = value
        progress = None
        deferred = False
        if isinstance(value, OperationResult):
            result, deferred = value.result, value.deferred
            if value.progress_current is not None or value.progress_total is not None:
                progress = (value.progress_current, value.progress_total)
        if isinstance(result, dict) and (
            "_progress_current" in result or "_progress_total" in result
        ):
            progress = (result.get("_progress_current"), result.get("_progress_total"))
        # Every value is checked here, per job, before it joins a batch: one bad
        # value fails its own job, never the batch or the worker.
        if progress is not None:
            try:
                progress = checked_progress(*progress)
            except InvalidProgress as error:
                return self._fail(flight, "InvalidProgress", str(error))
        try:
            result = _json_safe(result, "result")
        except ResultTooLarge as error:
            return self._fail(flight, "ResultTooLarge", str(error))
        except UnstorableValue as error:
            return self._fail(flight, "ResultNotSerializable", str(error))
        if flight.cancel.is_set():
            return Outcome("cancelled")
        try:
            if deferred:

                def defer() -> None:
                    transitions.defer_job(
                        job.id, lease_token=job.lease_token, result=result, progress=progress
                    )

                if atomic:  # inside the operation's transaction: a retry could not help
                    defer()
                else:  # the operation's work is done: store its outcome through an outage
                    with_db_retry(
                        defer, what="defer", sleep=flight.cancel.wait, give_up=flight.cancel.is_set
                    )
                return Outcome("deferred")
            completion = Completion(
                job.id,
                job.lease_token,
                result,
                progress,
                int((time.monotonic() - flight.started) * 1000),
            )
            if atomic:
                transitions.complete_job(
                    job.id,
                    lease_token=job.lease_token,
                    result=result,
                    progress=progress,
                    event_fields={"duration_ms": completion.duration_ms},
                )
                return Outcome("succeeded")
            return Outcome("succeeded", completion=completion)
        except LeaseLost:
            return Outcome("lease_lost")

    def _handle_error(self, op: Operation, flight: InFlight, error: BaseException) -> Outcome:
        job = flight.job
        if _stops_worker(error):
            raise error
        if isinstance(error, JobCancelled) or flight.cancel.is_set():
            return Outcome("cancelled", error=error)
        if isinstance(error, LeaseLost):
            return Outcome("lease_lost", error=error)
        if is_outage(error):
            # The database went away under the operation (restart, dropped
            # connection): not the job's fault, so the attempt is not counted,
            # but only a few times (MAX_OUTAGE_REQUEUES). Any other database
            # error (a statement timeout, a missing table) is the operation's
            # own and is handled below like any exception.
            return self._requeue_after_outage(flight, error)
        # The operation's policy over this worker's configured backoff; the job's own
        # override (``Job.retry_policy``) goes over both where it is read (jobs.retry_policy).
        worker_policy = RetryPolicy(
            backoff_seconds=self.retry_backoff_seconds,
            backoff_max_seconds=self.retry_backoff_max_seconds,
        )
        policy = op.retry_policy.over(worker_policy)
        if isinstance(error, RetryLaterError):
            try:
                status = with_db_retry(
                    lambda: transitions.retry_job_later(
                        job.id,
                        lease_token=job.lease_token,
                        reason=error.reason,
                        delay_seconds=error.delay_seconds,
                        policy=policy,
                    ),
                    what="retry_later",
                    # Through a restart of any length: the job keeps its slot until
                    # the outcome is stored, the lease is lost, or the worker stops.
                    sleep=flight.cancel.wait,
                    give_up=flight.cancel.is_set,
                )
            except LeaseLost:
                return Outcome("lease_lost", error=error)
            if status == FAILED:  # past its bound (max_retry_later, retry_later_max_seconds)
                return Outcome(
                    "failed", error=error, error_code=RETRY_LATER_LIMIT, error_message=str(error)
                )
            return Outcome("retry_later", error=error)
        retryable = op.is_retryable(error) and job.attempt < job.max_attempts
        delay = None
        if retryable:
            stored = with_db_retry(
                lambda: stored_override(job.id),
                what="retry_policy",
                sleep=flight.cancel.wait,
                give_up=flight.cancel.is_set,
            )
            delay = resolved_policy(stored, policy).delay(job.attempt)
        return self._fail(
            flight,
            type(error).__name__,
            _error_text(error),
            retryable=retryable,
            backoff=delay,
            error=error,
        )

    def _requeue_after_outage(self, flight: InFlight, error: BaseException) -> Outcome:
        """Requeue with backoff (``job.outage_requeue``) or, past the budget, fail the job.

        The write waits through the outage (the job keeps its slot until it is
        stored, the lease is lost, or the worker stops): that is what frees
        the job soonest, since the alternative is its lease running out.
        """
        job = flight.job
        if not connection.in_atomic_block:
            reset_connection()
        base, cap = self.retry_backoff_seconds, self.retry_backoff_max_seconds
        try:
            status = with_db_retry(
                lambda: transitions.requeue_after_outage(
                    job.id,
                    lease_token=job.lease_token,
                    cause=describe(error),
                    max_requeues=self.max_outage_requeues,
                    backoff=lambda number: backoff_seconds(number, base, cap),
                ),
                what="outage_requeue",
                sleep=flight.cancel.wait,
                give_up=flight.cancel.is_set,
            )
        except (LeaseLost, ControlPlaneError):
            return Outcome("lease_lost", error=error)
        return Outcome("outage_requeue" if status == "queued" else "failed", error=error)

    def _fail(
        self,
        flight: InFlight,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        backoff: float | None = None,
        error: BaseException | None = None,
    ) -> Outcome:
        job = flight.job
        trace, frame = _trace_of(error)
        try:
            status = with_db_retry(
                lambda: transitions.fail_job(
                    job.id,
                    lease_token=job.lease_token,
                    error_code=code,
                    error_message=message,
                    retryable=retryable,
                    backoff_seconds=backoff,
                    traceback=trace,
                    frame=frame,
                ),
                what="fail",
                sleep=flight.cancel.wait,
                give_up=flight.cancel.is_set,
            )
        except (LeaseLost, ControlPlaneError):
            return Outcome("lease_lost", error=error)
        except Exception:  # noqa: BLE001 - the session is broken; try a fresh one
            return self._fail_fresh(job, code, message, error=error)
        return Outcome(
            "retry_scheduled" if status == "queued" else "failed",
            error=error,
            error_code=code,
            error_message=message,
        )

    def _fail_fresh(
        self, job: ClaimedJob, code: str, message: str, *, error: BaseException | None = None
    ) -> Outcome:
        """Mark the job failed on a brand-new connection when ours cannot commit."""
        trace, frame = _trace_of(error)
        try:
            with independent_connection() as alias:
                transitions.fail_job(
                    job.id,
                    lease_token=job.lease_token,
                    error_code=code,
                    error_message=message,
                    traceback=trace,
                    frame=frame,
                    using=alias,
                )
            return Outcome("failed", error=error, error_code=code, error_message=message)
        except LeaseLost:
            return Outcome("lease_lost")
        except Exception:  # noqa: BLE001 - the lease will expire and the reaper takes over
            log.exception("job.fail_fresh_failed job_id=%s", job.id)
            return Outcome("lost")


def _trace_of(error: BaseException | None) -> tuple[str, str | None]:
    """The formatted traceback and raising frame of ``error``: ("", None) without one."""
    if error is None or error.__traceback__ is None:
        return "", None
    return format_traceback(error), innermost_frame(error)
