"""What a job's outcome signal and its operation's hooks receive (``jobs.signals``).

Value objects only, so ``jobs.operations`` (the hooks' signatures) and
``jobs.signals`` (which sends them) share them without importing each other.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobOutcome:
    """One job's outcome as the signals and the operation hooks receive it.

    ``attempt`` is the attempt that ran (1 for the first); ``event`` and
    ``message`` are the timeline event written with the change, ``fields``
    its fields (the error's fingerprint, a retry's ``delay_seconds``, an
    operator's ``by`` and ``reason``). ``result`` is set for a success only.
    """

    job_id: uuid.UUID
    operation: str
    queue: str
    status: str
    attempt: int
    max_attempts: int
    event: str
    message: str = ""
    error_code: str = ""
    error_message: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    result: Any = None

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every receiver gets: each field, and ``outcome`` itself."""
        return {
            "outcome": self,
            "job_id": self.job_id,
            "operation": self.operation,
            "queue": self.queue,
            "status": self.status,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "event": self.event,
            "message": self.message,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "fields": self.fields,
            "result": self.result,
        }


@dataclass(frozen=True)
class JobError:
    """Why a job failed, as ``Operation.on_failure`` receives it: the stored code and message."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message
