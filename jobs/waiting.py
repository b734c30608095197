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
- **dependencies**: it waits for other jobs (``jobs.dependencies``): its
  ``run_after`` is NULL until the transaction that ends its last dependency
  releases it. ``dependency_wait`` says how many of how many are unmet and
  which failed dependencies hold it for an operator. This kind is what a
  badge shows; it is not a ``when`` filter value (``KINDS``), which the API's
  contract fixes.

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
from jobs.models import Dependency, JobEvent, OnFailure
from jobs.states import CANCELLED, FAILED, QUEUED

SCHEDULED = "scheduled"
RETRYING = "retrying"
KINDS = (SCHEDULED, RETRYING)
# A queued job whose dependencies have not all been met (not a filter kind).
DEPENDENCIES = "dependencies"


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
    run_after: datetime | None  # None while it waits for dependencies
    attempt: int
    max_attempts: int
    due: bool  # run_after has passed: a worker may claim it now
    waiting_for: int = 0  # unmet dependencies (kind DEPENDENCIES)

    @property
    def label(self) -> str:
        if self.kind == DEPENDENCIES:
            n = self.waiting_for
            if n <= 0:
                return "waiting for its dependencies"
            return f"waiting for {n} dependenc{'y' if n == 1 else 'ies'}"
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
    if job.run_after is None:  # released (run_after set) by its last dependency's end
        return Waiting(
            kind=DEPENDENCIES,
            run_after=None,
            attempt=min(job.attempts + 1, job.max_attempts),
            max_attempts=job.max_attempts,
            due=False,
            waiting_for=int(getattr(job, "waiting_for", 0) or 0),
        )
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


# How many failed dependencies a held job names (the rest are counted).
HELD_NAMED = 5


@dataclass(frozen=True)
class DependencyWait:
    """Why a queued job waiting for dependencies is not starting, for its page."""

    unmet: int
    total: int
    # Failed or cancelled dependencies whose edge says ``hold``: step names (else ids).
    held_by: tuple[str, ...] = ()
    held_count: int = 0

    @property
    def sentence(self) -> str:
        noun = "dependency" if self.total == 1 else "dependencies"
        text = f"waiting for {self.unmet} of {self.total} {noun}"
        if self.held_count:
            names = ", ".join(self.held_by)
            more = self.held_count - len(self.held_by)
            if more > 0:
                names += f" and {more} more"
            text += (
                f"; held for an operator: {names} ended without success "
                "(retry it to resume, or cancel)"
            )
        return text


def dependency_wait(job: Any, *, total: int | None = None) -> DependencyWait | None:
    """The dependency reason a queued job is not starting, or None if it waits for none.

    ``job.waiting_for`` is the count of unmet edges (kept in the transactions
    that meet them); ``total`` (else counted on the dependency table's
    ``(job, upstream)`` index) is how many it has. Only edges that say
    ``hold`` are joined to their upstreams, to name the failed ones.
    """
    if getattr(job, "status", None) != QUEUED or job.run_after is not None:
        return None
    edges = Dependency.objects.filter(job_id=job.pk)
    if total is None:
        total = edges.count()
    held = edges.filter(
        met=False,
        on_failure=OnFailure.HOLD,
        upstream__status__in=(FAILED, CANCELLED),
    )
    named = list(held.order_by("id").values_list("upstream_id", "upstream__step")[:HELD_NAMED])
    held_count = len(named) if len(named) < HELD_NAMED else held.count()
    return DependencyWait(
        unmet=int(job.waiting_for or 0),
        total=total,
        held_by=tuple(step or str(upstream_id) for upstream_id, step in named),
        held_count=held_count,
    )
