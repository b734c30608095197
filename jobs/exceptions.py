"""The project's exceptions. Each message is a sentence that says what to do."""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Root of every error this project raises on purpose."""


class IllegalTransition(ControlPlaneError):
    """A job was asked to move between two states the state machine forbids."""

    def __init__(self, *, source: str, target: str, job_id: object = None) -> None:
        self.source, self.target, self.job_id = source, target, job_id
        who = f"Job {job_id}" if job_id else "A job"
        super().__init__(
            f"{who} cannot move from '{source}' to '{target}'; "
            "see jobs.states.ALLOWED for the transitions that exist."
        )


class JobNotFound(ControlPlaneError):
    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"No job with id {job_id} exists.")


class LeaseLost(ControlPlaneError):
    """The caller's lease token is no longer the job's current one."""

    def __init__(self, job_id: object, status: str | None = None) -> None:
        self.job_id, self.status = job_id, status
        super().__init__(
            f"Job {job_id} is no longer held under this lease token (status now "
            f"'{status}'); another worker or the reaper has taken it over."
        )


class UnstorableValue(ControlPlaneError, ValueError):
    """A result or an event's fields hold something no database can store (see jobs.storable)."""


class JobCancelled(ControlPlaneError):
    """Raised inside an operation once its job has been cancelled; let it propagate."""

    def __init__(self, job_id: object) -> None:
        self.job_id = job_id
        super().__init__(f"Job {job_id} was cancelled; stop working on it.")


class EnqueueError(ControlPlaneError):
    """Enqueue refused: the job was not stored. ``errors`` maps fields to messages."""

    def __init__(self, message: str, errors: dict[str, list[str]] | None = None) -> None:
        self.message = message
        self.errors = errors or {}
        super().__init__(message)


class UnknownOperation(EnqueueError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"Unknown operation {name!r}; register it or check the spelling.",
            {"operation": [f"Unknown operation {name!r}."]},
        )


class RetryLaterError(ControlPlaneError):
    """Raised by an operation to be run again later, without counting a failed attempt.

    Bounded all the same (``jobs.retry_policy``): past its policy's
    ``max_retry_later`` times, or ``retry_later_max_seconds`` after the job was
    enqueued, the job fails with ``RetryLaterLimit`` instead of waiting again.
    """

    def __init__(self, reason: str = "", delay_seconds: float = 60.0) -> None:
        self.reason = reason
        self.delay_seconds = float(delay_seconds)
        super().__init__(reason or f"Retry in {delay_seconds} s.")
