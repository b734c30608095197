"""Bulk cancel and retry: the jobs of a filter or a selection, changed in batches, audited once.

One walk for every face: the matching eligible jobs are read newest first a
batch at a time (a keyset walk, so changing one batch skips and repeats
nothing), each batch goes through ``jobs.transitions`` (guarded, an event
per job carrying ``by``), and one ``OperatorAction`` row records the action
with its filter and the true count, even when a batch fails midway.

The REST API and the ``jobs`` command act on every match (``bulk_cancel``,
``bulk_retry``). The dashboard and the admin first *plan* (``plan_bulk``:
counts shown to the operator for confirmation, under the statement timeout)
and then *run* (``run_bulk``) at most ``COUNT_CAP`` jobs per run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from jobs import audit
from jobs.models import Job
from jobs.operator_actions import normalise_reason
from jobs.selectors import CountResult, JobFilters, capped_count, count_cap, job_queryset
from jobs.selectors.jobs import id_batches
from jobs.selectors.timeouts import bounded_reads
from jobs.states import CANCELLED, FAILED, QUEUED, RUNNING
from jobs.transitions import cancel_jobs, retry_jobs

# The statuses each bulk action changes.
ACTIONS: dict[str, tuple[str, ...]] = {
    "cancel": (QUEUED.value, RUNNING.value),
    "retry": (FAILED.value, CANCELLED.value),
}
BULK_BATCH_SIZE = 500


def bulk_cancel(
    filters: JobFilters,
    *,
    user: Any = None,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
    described: dict[str, Any] | None = None,
) -> int:
    """Cancel the queued and running jobs matching ``filters`` (and their descendants).

    Returns how many jobs changed state, cascades included. ``by`` names the
    actor in the jobs' timelines (default: ``user``'s name); ``described`` is
    the filter as the audit row stores it (default: its set fields).
    """
    return _bulk(
        "cancel",
        job_queryset(filters),
        user=user,
        by=by,
        reason=reason,
        batch_size=batch_size,
        target="filter",
        described=filters.describe() if described is None else described,
    )


def bulk_retry(
    filters: JobFilters,
    *,
    user: Any = None,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
    described: dict[str, Any] | None = None,
) -> int:
    """Put the failed and cancelled jobs matching ``filters`` back on their queues (audited)."""
    return _bulk(
        "retry",
        job_queryset(filters),
        user=user,
        by=by,
        reason=reason,
        batch_size=batch_size,
        target="filter",
        described=filters.describe() if described is None else described,
    )


@dataclass(frozen=True)
class BulkPlan:
    """What a bulk action would touch: the eligible jobs of a selection or of a filter."""

    action: str
    scope: str  # "selected" or "filter"
    ids: tuple[uuid.UUID, ...]
    filters: JobFilters
    eligible: CountResult
    considered: CountResult

    @property
    def limit(self) -> int:
        return count_cap()

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


def plan_bulk(
    action: str, *, scope: str, ids: Sequence[uuid.UUID] = (), filters: JobFilters | None = None
) -> BulkPlan:
    """Count what ``action`` would change, for the confirmation step.

    The counts run under the statement timeout (``bounded_reads``): a filter
    the indexes cannot serve raises a timeout ``DatabaseError`` (the face
    shows its "too slow" answer) instead of holding the database.
    """
    if action not in ACTIONS:
        raise ValueError(f"Unknown bulk action {action!r}; use cancel or retry.")
    filters = filters or JobFilters()
    everything = _selection(scope, ids, filters)
    eligible = everything.filter(status__in=ACTIONS[action])
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


def run_bulk(plan: BulkPlan, *, user: Any, reason: str = "") -> int:
    """Run a planned bulk action on at most ``COUNT_CAP`` jobs, newest first; return how
    many changed (cascaded children included). Each batch of ids is read under the
    statement timeout; recorded once, even when a read times out midway."""
    return _bulk(
        plan.action,
        _selection(plan.scope, plan.ids, plan.filters),
        user=user,
        by=None,
        reason=reason,
        batch_size=None,
        target=plan.scope,
        described=plan.describe(),
        budget=count_cap(),
        bounded=True,
    )


def _selection(scope: str, ids: Sequence[uuid.UUID], filters: JobFilters) -> QuerySet[Job]:
    if scope == "selected":
        return Job.objects.filter(pk__in=list(ids))
    return filters.apply(Job.objects.all())


def _bulk(
    action: str,
    queryset: QuerySet[Job],
    *,
    user: Any,
    by: str | None,
    reason: str | None,
    batch_size: int | None,
    target: str,
    described: dict[str, Any],
    budget: int | None = None,
    bounded: bool = False,
) -> int:
    """The one walk: eligible ids in batches, each batch changed, one audit row at the end."""
    reason_text = normalise_reason(reason)
    actor = by if by is not None else (audit.actor_name(user) if user is not None else None)
    change = cancel_jobs if action == "cancel" else retry_jobs
    batches = id_batches(
        queryset.filter(status__in=ACTIONS[action]),
        batch_size=batch_size or BULK_BATCH_SIZE,
        budget=budget,
        bounded=bounded,
    )
    changed = 0
    try:
        for ids in batches:
            changed += len(change(ids, by=actor, reason=reason_text or None))
    finally:
        audit.record_action(
            user if user is not None else actor,
            audit.BULK_CANCEL if action == "cancel" else audit.BULK_RETRY,
            target=target,
            count=changed,
            filters=described,
            reason=reason_text,
        )
    return changed
