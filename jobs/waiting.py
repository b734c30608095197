"""Why a queued job is waiting: *scheduled* for later, or *retrying* after a run.

Both stay ``queued`` in the API (the states are fixed by the contract); the
job filters (``when``) and the dashboard's badges tell them apart so
operators can find them:

- **retrying**: the job has run before (a ``job.started`` is on its
  timeline) and waits to run again: a retry with backoff, a
  ``RetryLaterError``, a requeue after a lease expiry or a shutdown, an
  operator's retry. ``attempts`` counts only the failed attempts (a retry
  later or a requeue gives its attempt back), so the timeline, not the
  counter, says whether it ran; ``attempts >= 1`` answers first without it.
- **scheduled**: it has never run and its ``run_after`` is in the future.

The "has it run" test walks one job's entries of the unique ``(job, seq)``
index and stops at the first ``job.started`` (among a job's first events);
both views only ever test queued rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.events import JOB_STARTED
from jobs.models import JobEvent
from jobs.states import QUEUED

SCHEDULED = "scheduled"
RETRYING = "retrying"
KINDS = (SCHEDULED, RETRYING)


def has_run() -> Exists:
    """Whether the outer job has ever been claimed (an annotation or a filter)."""
    return Exists(JobEvent.objects.filter(job_id=OuterRef("pk"), event=JOB_STARTED))


def _ran() -> Q:
    return Q(attempts__gte=1) | Q(has_run())


def condition(kind: str, now: datetime | None = None) -> Q:
    """The filter for one kind of waiting job."""
    if kind == RETRYING:
        return Q(status=QUEUED) & _ran()
    if kind == SCHEDULED:
        return Q(status=QUEUED, run_after__gt=now or timezone.now()) & ~_ran()
    raise ValueError(f"Unknown kind {kind!r}; use {' or '.join(KINDS)}.")


@dataclass(frozen=True)
class Waiting:
    """A queued job's reason to wait, as its badge shows it."""

    kind: str
    run_after: datetime
    attempt: int
    max_attempts: int
    due: bool  # run_after has passed: a worker may claim it now

    @property
    def label(self) -> str:
        if self.kind == RETRYING:
            return f"retrying (attempt {self.attempt} of {self.max_attempts})"
        return SCHEDULED


def waiting_of(job: Any, now: datetime | None = None) -> Waiting | None:
    """The job's waiting kind, or None (not queued, or queued, never run and due).

    Reads ``job.has_run`` when the row was read with ``has_run()`` annotated
    (the list does), otherwise asks the database once (the job page).
    """
    if getattr(job, "status", None) != QUEUED:
        return None
    now = now or timezone.now()
    ran = job.attempts >= 1
    if not ran:
        ran = getattr(job, "has_run", None)
        if ran is None:
            ran = JobEvent.objects.filter(job_id=job.pk, event=JOB_STARTED).exists()
    due = job.run_after <= now
    if not ran and due:
        return None
    return Waiting(
        kind=RETRYING if ran else SCHEDULED,
        run_after=job.run_after,
        attempt=min(job.attempts + 1, job.max_attempts),
        max_attempts=job.max_attempts,
        due=due,
    )
