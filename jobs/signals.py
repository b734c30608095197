"""Django signals for the outcomes of jobs, sent once per outcome after its commit.

The one home of status writes (``jobs.transitions._write``) and the worker's
batched successes (``workers.engine.JobWorker._finish``) call ``dispatch``
with what moved; it sends each outcome's signal once the transaction that
wrote it has committed (``transaction.on_commit``: a rolled-back write sends
nothing), in the process that made the change: the worker, the reaper, the
web process (REST API, remote workers' complete/fail, dashboard) or a
management command.

Receivers are called through ``send_robust``: one that raises is logged and
the others still run; the job's outcome is written already and stays as it
is. Receivers run in the thread that made the change (a worker's main loop
for its batched successes), so they should be quick: hand slow work to a job.

Nothing is built when nothing listens: ``wanted`` is a look at the signal's
receiver list and the registry's hooks, so a process without receivers pays
no query and no payload per job.

Which write sends which signal:

- ``job_succeeded``: running -> succeeded (a run, a remote worker's
  complete, a deferred parent closed by its last batch).
- ``job_failed``: -> failed (the run's error, a timeout, an expired lease
  past its budget, a shutdown that could not requeue).
- ``job_cancelled``: -> cancelled (an operator, or the parent's cancel).
- ``job_retry_scheduled``: running -> queued after a failure with attempts left.
- ``job_retry_later``: running -> queued because the operation asked
  (``RetryLaterError``), the attempt not counted.
- ``job_requeued``: running -> queued now or after a backoff, not asked by the
  operation: a shutdown, a remote disconnect, an operator's requeue, a lease
  rescue, a database outage (``event`` says which).
- ``job_retried``: failed or cancelled -> queued by an operator.

No signal for ``queued -> running`` (the ``job.started`` event and the
worker's ``pre_handle`` hook are there) nor for the enqueue, which the
enqueuing code does itself and can follow with its own ``on_commit``.

Per operation, ``Operation.on_success(outcome, result)`` and
``Operation.on_failure(outcome, error)`` (a ``JobError``) run after the signal, in the same
process, when that process has the operation registered (a worker always
does; a web process only for the operations it imports).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import transaction
from django.dispatch import Signal

from jobs import events
from jobs.outcomes import JobError, JobOutcome
from jobs.states import CANCELLED, FAILED, QUEUED, SUCCEEDED, Status

if TYPE_CHECKING:
    from jobs.claims import ClaimedJob, Completion
    from jobs.operations import OperationRegistry

__all__ = [
    "JobError",
    "JobOutcome",
    "job_cancelled",
    "job_failed",
    "job_requeued",
    "job_retried",
    "job_retry_later",
    "job_retry_scheduled",
    "job_succeeded",
]

log = logging.getLogger("jobs.signals")

job_succeeded = Signal()
job_failed = Signal()
job_cancelled = Signal()
job_retry_scheduled = Signal()
job_retry_later = Signal()
job_requeued = Signal()
job_retried = Signal()

_BY_STATUS: dict[Status, Signal] = {
    SUCCEEDED: job_succeeded,
    FAILED: job_failed,
    CANCELLED: job_cancelled,
}
_NAMES: dict[Signal, str] = {
    job_succeeded: "job_succeeded",
    job_failed: "job_failed",
    job_cancelled: "job_cancelled",
    job_retry_scheduled: "job_retry_scheduled",
    job_retry_later: "job_retry_later",
    job_requeued: "job_requeued",
    job_retried: "job_retried",
}
_HOOKS: dict[Signal, str] = {job_succeeded: "on_success", job_failed: "on_failure"}
_BACK_TO_QUEUED: dict[str, Signal] = {
    events.JOB_RETRY_SCHEDULED: job_retry_scheduled,
    events.JOB_RETRY_LATER: job_retry_later,
    events.JOB_REQUEUED: job_requeued,
    events.JOB_LEASE_EXPIRED_REQUEUE: job_requeued,
    events.JOB_OUTAGE_REQUEUE: job_requeued,
    events.JOB_RETRIED: job_retried,
}


def signal_for(status: Status | str | None, event: str) -> Signal | None:
    """The signal a write to ``status`` with ``event`` sends; None for changes that send none."""
    if status is None:
        return None
    status = Status(status)
    if status == QUEUED:
        return _BACK_TO_QUEUED.get(event)
    return _BY_STATUS.get(status)


def _default_registry() -> OperationRegistry:
    from jobs.operations import registry

    return registry


def hooked(signal: Signal, registry: OperationRegistry | None = None) -> bool:
    """Whether an operation of ``registry`` has the hook ``signal`` drives.

    ``on_success`` for ``job_succeeded``, ``on_failure`` for ``job_failed``;
    no other signal drives a hook.
    """
    from jobs.operations import Operation

    hook = _HOOKS.get(signal)
    if hook is None:
        return False
    base = getattr(Operation, hook)
    return any(
        getattr(type(op), hook) is not base for op in (registry or _default_registry()).all()
    )


def wanted(signal: Signal | None, registry: OperationRegistry | None = None) -> bool:
    """Whether an outcome for ``signal`` has anyone to hear it: a receiver, or an operation hook.

    Costs a list's truth test when nothing is connected, and a look at the
    registry's operations for the two signals that drive hooks.
    """
    if signal is None:
        return False
    return bool(signal.receivers) or hooked(signal, registry)


def success_outcome(job: ClaimedJob, completion: Completion) -> JobOutcome:
    """The ``job_succeeded`` outcome of a worker's own success write (``complete_jobs``),
    from the run's own facts: no query."""
    return JobOutcome(
        job_id=completion.job_id,
        operation=job.operation,
        queue=job.queue,
        status=SUCCEEDED.value,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        event=events.JOB_SUCCEEDED,
        fields={"duration_ms": completion.duration_ms},
        result=completion.result,
    )


def dispatch(
    signal: Signal,
    outcomes: Sequence[JobOutcome],
    *,
    using: str = "default",
    registry: OperationRegistry | None = None,
) -> None:
    """Send ``signal`` for each outcome, and run the operations' hooks, once ``using`` commits.

    Outside a transaction (the write committed already) they are sent now.
    """
    if outcomes:
        transaction.on_commit(
            functools.partial(_send, signal, tuple(outcomes), registry), using=using
        )


def _send(
    signal: Signal, outcomes: tuple[JobOutcome, ...], registry: OperationRegistry | None
) -> None:
    from jobs.models import Job

    registry = registry or _default_registry()
    for outcome in outcomes:
        if signal.receivers:
            for receiver, response in signal.send_robust(sender=Job, **outcome.as_kwargs()):
                if isinstance(response, BaseException):
                    log.error(
                        "signal.receiver_failed signal=%s receiver=%s job_id=%s error=%s",
                        _NAMES.get(signal, "?"),
                        getattr(receiver, "__qualname__", receiver),
                        outcome.job_id,
                        f"{type(response).__name__}: {response}",
                        exc_info=response,
                    )
        if signal in _HOOKS:
            _run_hook(registry, outcome)


def _run_hook(registry: OperationRegistry, outcome: JobOutcome) -> None:
    """The operation's ``on_success``/``on_failure``, when this process has it; errors logged."""
    if outcome.operation not in registry:
        return
    op = registry.get(outcome.operation)
    try:
        if outcome.status == SUCCEEDED:
            op.on_success(outcome, outcome.result)
        else:
            op.on_failure(outcome, JobError(outcome.error_code, outcome.error_message))
    except Exception as error:  # noqa: BLE001 - the outcome is written; a hook cannot undo it
        log.error(
            "operation.hook_failed operation=%s job_id=%s hook=%s error=%s",
            outcome.operation,
            outcome.job_id,
            "on_success" if outcome.status == SUCCEEDED else "on_failure",
            f"{type(error).__name__}: {error}",
            exc_info=error,
        )
