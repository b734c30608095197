"""Job states and the one table of allowed transitions.

Every write that changes a job's status goes through ``jobs.transitions``,
which checks its move against ``ALLOWED`` before it touches the database.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models

from jobs.exceptions import IllegalTransition

if TYPE_CHECKING:
    from enum import EnumType, StrEnum
    from typing import Self

    class _ChoicesType(EnumType):
        @property
        def choices(cls) -> list[tuple[str, str]]: ...
        @property
        def values(cls) -> list[str]: ...
        @property
        def labels(cls) -> list[str]: ...
        @property
        def names(cls) -> list[str]: ...

    class TextChoices(StrEnum, metaclass=_ChoicesType):
        """Django's ``TextChoices`` as mypy should see it.

        Django ships no type information, so mypy takes ``models.TextChoices``
        for ``Any`` and ``Status.QUEUED`` for the tuple written in the class
        body. At run time it is a ``StrEnum`` (Django 5+) whose metaclass
        splits ``value, label``; declaring that here makes every member a
        ``Status`` (still the same ``str`` in the database and the API).
        """

        _value_: str

        def __new__(cls, value: str, label: str = ...) -> Self: ...
        @property
        def label(self) -> str: ...

else:
    TextChoices = models.TextChoices


class Status(TextChoices):
    # Waiting to be claimed (possibly not before ``run_after``).
    QUEUED = "queued", "Queued"
    # Claimed by a worker that holds its lease (or a deferred coordinator).
    RUNNING = "running", "Running"
    # The operation returned, or the last batch of a coordinator was written.
    SUCCEEDED = "succeeded", "Succeeded"
    # Out of attempts, lease expired too often, timed out or force-failed.
    FAILED = "failed", "Failed"
    # Stopped by an operator or by the cancellation of its parent.
    CANCELLED = "cancelled", "Cancelled"


QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    Status.QUEUED,
    Status.RUNNING,
    Status.SUCCEEDED,
    Status.FAILED,
    Status.CANCELLED,
)

TERMINAL: frozenset[Status] = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE: frozenset[Status] = frozenset({QUEUED, RUNNING})

ALLOWED: frozenset[tuple[Status, Status]] = frozenset(
    {
        (QUEUED, RUNNING),  # claim
        (QUEUED, CANCELLED),  # cancel before it ran
        (RUNNING, SUCCEEDED),  # operation returned; last batch written
        (RUNNING, FAILED),  # out of attempts, lease budget, timeout, shutdown
        (RUNNING, QUEUED),  # retry later, retry with backoff, lease requeue, shutdown
        (RUNNING, CANCELLED),  # cooperative cancel
        (FAILED, QUEUED),  # operator retry
        (CANCELLED, QUEUED),  # operator retry
    }
)


def check_transition(source: Status | str, target: Status | str) -> None:
    """Raise ``IllegalTransition`` unless ``source -> target`` is in the table."""
    if (Status(source), Status(target)) not in ALLOWED:
        raise IllegalTransition(source=str(source), target=str(target))


def sources_for(target: Status) -> tuple[Status, ...]:
    """States a job may be in for a move to ``target``, in a stable order."""
    return tuple(s for s in Status if (s, target) in ALLOWED)
