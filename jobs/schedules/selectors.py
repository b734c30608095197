"""Reads for the API and the dashboard: schedules with their last outcome, one with its history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Field, OuterRef, QuerySet, Subquery, UUIDField

from jobs.models import Schedule, ScheduleFire

HISTORY = 20


@dataclass(frozen=True)
class FireRow:
    """One fired slot as the history shows it."""

    fire_at: datetime
    fired_at: datetime
    outcome: str
    job: uuid.UUID | None
    job_status: str | None
    # A workflow schedule's fire: the workflow it started, and its status.
    workflow: uuid.UUID | None = None
    workflow_status: str | None = None


def _newest_fire(field: str, output_field: Field | None = None) -> Subquery:
    return Subquery(
        ScheduleFire.objects.filter(schedule_id=OuterRef("pk"))
        .order_by("-fire_at")
        .values(field)[:1],
        output_field=output_field,
    )


def schedules_with_outcome() -> QuerySet[Schedule]:
    """Every schedule, by name, with ``last_outcome``, ``last_job`` and ``last_workflow``
    of its newest fire.

    ``last_outcome`` is the newest fire's job status (``queued``, ``succeeded``,
    ``failed``…), its workflow's status (``running``, ``held``…) for a workflow
    schedule, or, for a fire that made neither, its outcome (``skipped_overlap``,
    ``enqueue_failed``); None before the first fire. The unique (schedule,
    fire_at) index serves every lookup.
    """
    return Schedule.objects.order_by("name").annotate(
        newest_outcome=_newest_fire("outcome"),
        last_job=_newest_fire("job_id", UUIDField()),
        last_job_status=_newest_fire("job__status"),
        last_workflow=_newest_fire("workflow_id", UUIDField()),
        last_workflow_status=_newest_fire("workflow__status"),
    )


def last_outcome(schedule: Any) -> str | None:
    """The outcome an annotated schedule shows (see ``schedules_with_outcome``)."""
    return (
        getattr(schedule, "last_job_status", None)
        or getattr(schedule, "last_workflow_status", None)
        or getattr(schedule, "newest_outcome", None)
    )


def schedule_list() -> list[Schedule]:
    return list(schedules_with_outcome())


def schedule_get(schedule_id: uuid.UUID | str) -> Schedule | None:
    """One annotated schedule, or None (an id that is not a UUID names none)."""
    try:
        key = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
    except ValueError:
        return None
    return schedules_with_outcome().filter(pk=key).first()


def schedule_history(schedule_id: uuid.UUID, limit: int = HISTORY) -> list[FireRow]:
    """The newest ``limit`` fires of a schedule, newest first, with their jobs' (or
    workflows') states."""
    rows = (
        ScheduleFire.objects.filter(schedule_id=schedule_id)
        .order_by("-fire_at")
        .values_list(
            "fire_at",
            "fired_at",
            "outcome",
            "job_id",
            "job__status",
            "workflow_id",
            "workflow__status",
        )[:limit]
    )
    return [FireRow(*row) for row in rows]
