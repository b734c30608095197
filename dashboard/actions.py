"""What operators do from the dashboard: plain functions the views call after their checks.

Every job change goes through ``jobs.transitions`` so it is guarded and
leaves an event carrying the operator's name (``by``) and reason, and every
action writes one ``OperatorAction`` audit row (``dashboard.audit``) with the
number of jobs it changed, in the same transaction where the change is a
single write. Bulk actions first *plan* (count what would change, shown to
the operator for confirmation), then *run* in batches of a few hundred ids,
newest first, and are recorded once with their filter.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from dashboard import audit
from dashboard.db import Count, bounded_reads, cap, capped_count
from dashboard.filters import JobFilters
from dashboard.permissions import actor_name
from dashboard.selectors import live_worker_ids
from jobs import operator_actions
from jobs.exceptions import ControlPlaneError, JobNotFound
from jobs.models import Job
from jobs.operator_actions import set_concurrency_cap as set_concurrency_cap
from jobs.operator_actions import set_paused as set_paused
from jobs.operator_actions import set_rate_limit as set_rate_limit
from jobs.rescheduling import NotWaiting, run_job_now
from jobs.selectors import JobCursor, after_cursor
from jobs.states import CANCELLED, FAILED, QUEUED, RUNNING, TERMINAL
from jobs.transitions import cancel_jobs, requeue_job, retry_jobs

ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": (QUEUED.value, RUNNING.value),
    "retry": (FAILED.value, CANCELLED.value),
}
BATCH = 500


def normalise_reason(reason: str | None) -> str:
    return (reason or "").strip()[:500]


# --- one job -------------------------------------------------------------------


def cancel_one(job_id: uuid.UUID, *, user: Any, reason: str = "") -> bool:
    """Cancel a queued or running job (and its descendants). False if it had already ended."""
    return operator_actions.cancel_job(job_id, user=user, reason=reason)


def retry_one(job_id: uuid.UUID, *, user: Any, reason: str = "") -> bool:
    """Put a failed or cancelled job back on its queue. False if it was not retryable."""
    return operator_actions.retry_job(job_id, user=user, reason=reason)


def requeue_orphan(job_id: uuid.UUID, *, user: Any) -> bool:
    """Requeue a running job whose worker is stale or gone. False if it is no longer orphaned.

    Checked again here, not only on the page: the worker may have come back
    since the page was drawn, and a live worker's job must not be taken away.
    """
    by = actor_name(user)
    job = (
        Job.objects.filter(pk=job_id, status=RUNNING, lease_token__isnull=False)
        .only("id", "worker_id")
        .first()
    )
    changed = False
    if job is not None and not (job.worker_id and job.worker_id in set(live_worker_ids())):
        reason = f"requeued by {by} from the dashboard: its worker is stale or gone"
        try:
            with transaction.atomic():
                requeue_job(job.pk, lease_token=None, reason=reason, by=by)
                audit.record_action(user, audit.REQUEUE_ORPHAN, target=str(job_id), count=1)
            changed = True
        except ControlPlaneError:
            pass
    if not changed:
        audit.record_action(user, audit.REQUEUE_ORPHAN, target=str(job_id), count=0)
    return changed


def run_now_one(job_id: uuid.UUID, *, user: Any, reason: str = "") -> bool:
    """Make a job waiting for a later time (scheduled, or a retry's backoff) claimable now.

    False if it was not waiting (already due, claimed or ended); the audit row
    is written either way, as for a refused retry. ``JobNotFound`` propagates.
    """
    reason = normalise_reason(reason)
    with transaction.atomic():
        try:
            with transaction.atomic():  # a refusal must not undo the audit row
                run_job_now(job_id, by=actor_name(user), reason=reason or None)
            changed = True
        except NotWaiting:
            changed = False
        audit.record_action(
            user, audit.RUN_NOW, target=str(job_id), count=int(changed), reason=reason
        )
    return changed


# Most descendants one discard deletes with its job; a bigger tree is left
# to the reaper's retention, which deletes in batches.
DISCARD_MAX_DESCENDANTS = 1000


@dataclass(frozen=True)
class Discard:
    """What a discard did: ``deleted`` jobs (the job and its descendants), or why none."""

    deleted: int = 0
    refused: str = ""


def _descendant_ids(job_id: uuid.UUID, limit: int) -> list[Any]:
    """Ids of every job below ``job_id`` (children, grandchildren…), at most ``limit``."""
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE tree(id) AS (SELECT id FROM {table} WHERE parent_id = %s "
            f"UNION SELECT j.id FROM {table} j JOIN tree t ON j.parent_id = t.id) "
            "SELECT id FROM tree LIMIT %s",
            [Job._meta.pk.get_db_prep_value(job_id, connection), limit],
        )
        return [row[0] for row in cursor.fetchall()]


def discard_one(job_id: uuid.UUID, *, user: Any, reason: str = "") -> Discard:
    """Delete a finished job with its timeline, batch rows and finished descendants.

    Refused (nothing deleted) while the job is queued or running, or while
    any job below it is: deleting a parent deletes its children, as the
    reaper's retention would once they had all finished. The job and every
    descendant are locked (PostgreSQL; SQLite's IMMEDIATE transaction holds
    the write lock) before their statuses are checked, and the tree is read
    again under the locks, so a retry or a new child landing meanwhile is
    seen rather than deleted. The audit row, written either way, names the
    job's operation and status in its ``filter``, as the job itself is gone.
    ``JobNotFound`` propagates.
    """
    reason = normalise_reason(reason)
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .filter(pk=job_id)
            .values("status", "operation", "queue")
            .first()
        )
        if job is None:
            raise JobNotFound(job_id)
        refused, below = _discard_check(job_id, job["status"])
        deleted = 0
        if not refused:
            _, per_model = Job.objects.filter(pk__in=[job_id, *below]).delete()
            deleted = per_model.get(Job._meta.label, 0)
        described = {**job, "descendants": len(below)}
        if refused:
            described["refused"] = refused
        audit.record_action(
            user, audit.DISCARD, target=str(job_id), count=deleted, filters=described, reason=reason
        )
    return Discard(deleted=deleted, refused=refused)


def _discard_check(job_id: uuid.UUID, status: str) -> tuple[str, list[Any]]:
    """Why the job may not be discarded (and no ids), or "" and its locked descendants."""
    terminal = {s.value for s in TERMINAL}
    if status not in terminal:
        return (
            f"Only a finished job can be discarded; this one is {status}. "
            "Cancel it first, or wait for it to finish."
        ), []
    found = _descendant_ids(job_id, DISCARD_MAX_DESCENDANTS + 1)
    if len(found) > DISCARD_MAX_DESCENDANTS:
        return (
            f"This job has more than {DISCARD_MAX_DESCENDANTS:,} descendants; "
            "the reaper's retention deletes a tree that big in batches."
        ), []
    statuses = Job.objects.select_for_update().filter(pk__in=found).values_list("status", flat=True)
    unfinished = sum(1 for s in statuses if s not in terminal)
    if unfinished:
        return (
            f"{_plural(unfinished, 'job')} below this one "
            f"{'is' if unfinished == 1 else 'are'} not finished; cancel them or wait for them "
            "first (discarding a parent deletes its children)."
        ), []
    if set(_descendant_ids(job_id, DISCARD_MAX_DESCENDANTS + 1)) != set(found):
        return "A child job was added meanwhile; nothing was deleted. Try again.", []
    return "", found


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# --- bulk ----------------------------------------------------------------------


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch: the eligible jobs of a selection or of a filter."""

    action: str
    scope: str  # "selected" or "filter"
    ids: tuple[uuid.UUID, ...]
    filters: JobFilters
    eligible: Count
    considered: Count

    @property
    def limit(self) -> int:
        return cap()

    def describe(self) -> dict[str, Any]:
        """The selection as stored in the audit log: the filter's fields, or the ids."""
        if self.scope == "selected":
            return {"scope": "selected", "ids": [str(i) for i in self.ids]}
        described: dict[str, Any] = {"scope": "filter"}
        for key, value in self.filters.params():
            if key == "status":
                described.setdefault("status", []).append(value)
            else:
                described[key] = value
        return described

    @property
    def truncated(self) -> bool:
        """More jobs match than one run changes (``COUNT_CAP``): run again for the rest."""
        return self.eligible.capped


def _eligible(action: str, *, ids: Sequence[uuid.UUID], filters: JobFilters, scope: str):
    qs = Job.objects.all()
    if scope == "selected":
        qs = qs.filter(pk__in=list(ids))
    else:
        qs = filters.apply(qs)
    return qs, qs.filter(status__in=ACTIONS[action])


def plan_bulk(
    action: str, *, scope: str, ids: Sequence[uuid.UUID] = (), filters: JobFilters | None = None
) -> BulkPlan:
    """Count what ``action`` would change, for the confirmation step.

    The counts run under the dashboard's statement timeout: a filter the
    indexes cannot serve raises a timeout ``DatabaseError`` (the view shows
    the "too slow" page) instead of holding the database.
    """
    if action not in ACTIONS:
        raise ValueError(f"Unknown bulk action {action!r}; use cancel or retry.")
    filters = filters or JobFilters()
    everything, eligible = _eligible(action, ids=ids, filters=filters, scope=scope)
    with bounded_reads():
        eligible_count, considered = capped_count(eligible), capped_count(everything)
    return BulkPlan(
        action=action,
        scope=scope,
        ids=tuple(ids),
        filters=filters,
        eligible=eligible_count,
        considered=considered,
    )


def _eligible_batches(plan: BulkPlan) -> Iterator[list[uuid.UUID]]:
    """Eligible ids, newest first, ``BATCH`` at a time, at most ``COUNT_CAP`` in all.

    Each page is read under the statement timeout (its own short read
    transaction); the writes that follow run outside it, as the engine's do.
    """
    _, qs = _eligible(plan.action, ids=plan.ids, filters=plan.filters, scope=plan.scope)
    qs = qs.order_by("-created_at", "-id")
    budget, cursor = cap(), None
    while budget > 0:
        page = after_cursor(qs, cursor) if cursor else qs
        with bounded_reads():
            rows = list(page.values_list("created_at", "id")[: min(BATCH, budget)])
        if not rows:
            return
        yield [r[1] for r in rows]
        budget -= len(rows)
        cursor = JobCursor(rows[-1][0], rows[-1][1])


def run_bulk(plan: BulkPlan, *, user: Any, reason: str = "") -> int:
    """Run a planned bulk action; return how many jobs changed (cascaded children included).

    Recorded once in the audit log with the count and the filter, even when a
    batch read times out midway (the batches already written stay written).
    """
    reason_text = normalise_reason(reason)
    by = actor_name(user)
    changed = 0
    try:
        for ids in _eligible_batches(plan):
            if plan.action == "cancel":
                changed += len(cancel_jobs(ids, by=by, reason=reason_text or None))
            else:
                changed += len(retry_jobs(ids, by=by, reason=reason_text or None))
    finally:
        audit.record_action(
            user,
            audit.BULK_CANCEL if plan.action == "cancel" else audit.BULK_RETRY,
            target=plan.scope,
            count=changed,
            filters=plan.describe(),
            reason=reason_text,
        )
    return changed


# --- queues --------------------------------------------------------------------


def parse_cap(raw: str) -> int | None:
    """A cap from a form: blank clears it; otherwise a whole number from 1 to 100,000."""
    raw = (raw or "").strip()
    if not raw:
        return None
    value = int(raw)  # ValueError for the view to report
    if not 1 <= value <= 100_000:
        raise ValueError(raw)
    return value
