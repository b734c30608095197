"""Operator actions on schedules: create, change, delete, pause, resume, run now.

Plain keyword functions shared by the REST API and the dashboard. Each one
writes its change and its audit row (``jobs.audit``) in one transaction;
``by`` is the Django user acting (None for a script); pause, resume and run
now also take the operator's optional ``reason`` for the audit row.

Resuming recomputes ``next_fire_at`` from now: the slots missed while paused
are skipped, whatever the schedule's ``catch_up`` (that policy is for slots
missed while no reaper ran). So a schedule paused for a week comes back
without a storm of catch-up runs.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction

from jobs import audit
from jobs.clock import db_now
from jobs.exceptions import ControlPlaneError
from jobs.models import Job, Schedule, Workflow
from jobs.schedules.definitions import (
    EDITABLE,
    TIMING_FIELDS,
    Definition,
    ScheduleInvalid,
    check_definition,
)
from jobs.schedules.firing import RUN_NOW, claim_slot, start_for
from jobs.schedules.timing import Timing

API = "api"
CODE = "code"


class ScheduleNotFound(ControlPlaneError, LookupError):
    def __init__(self, schedule_id: object) -> None:
        super().__init__(f"No schedule with id {schedule_id} exists.")


class ScheduleInCode(ControlPlaneError):
    """The schedule is declared in code: change it there, not through the API."""

    def __init__(self, schedule: Schedule) -> None:
        super().__init__(
            f"The schedule {schedule.name!r} is declared in code (an @operation's schedule or "
            "CONTROLPLANE['SCHEDULES']); change it there. Pause, resume and run work here."
        )


def _locked(schedule_id: uuid.UUID | str) -> Schedule:
    """The schedule's row, locked until the transaction ends; a non-UUID id names none."""
    try:
        key = schedule_id if isinstance(schedule_id, uuid.UUID) else uuid.UUID(str(schedule_id))
        return Schedule.objects.select_for_update().get(pk=key)
    except (Schedule.DoesNotExist, ValueError):
        raise ScheduleNotFound(schedule_id) from None


def _record(by: Any, action: str, schedule: Schedule, reason: str = "", **details: Any) -> None:
    audit.record_action(
        by,
        action,
        target=schedule.name,
        filters={"schedule": str(schedule.pk), **details},
        reason=reason,
    )


def _what(schedule: Schedule) -> dict[str, str]:
    """What the schedule fires, for its audit rows: the operation, or the workflow's name."""
    if schedule.workflow is None:
        return {"operation": schedule.operation}
    return {"workflow": str(schedule.workflow.get("name") or "")}


def create_schedule(
    values: dict[str, Any],
    *,
    by: Any = None,
    source: str = API,
    paused: bool = False,
    now: datetime | None = None,
) -> Schedule:
    """A new schedule from ``values`` (the fields of ``Definition``); ``ScheduleInvalid`` if not.

    Its first fire is the first slot after now.
    """
    definition = check_definition(values)
    now = now or db_now()
    try:
        with transaction.atomic():
            schedule = Schedule.objects.create(
                **definition.values(),
                source=source,
                paused=paused,
                next_fire_at=definition.timing.next_after(now),
            )
            _record(by, audit.SCHEDULE_CREATE, schedule, **_what(schedule))
    except IntegrityError:
        if Schedule.objects.filter(name=definition.name).exists():
            raise ScheduleInvalid(
                {"name": [f"A schedule named {definition.name!r} already exists."]}
            ) from None
        raise
    return schedule


def update_schedule(
    schedule_id: uuid.UUID | str,
    values: dict[str, Any],
    *,
    by: Any = None,
    now: datetime | None = None,
) -> Schedule:
    """Change the ``EDITABLE`` fields of an API schedule; a new timing fires from now on."""
    not_editable = sorted(set(values) - set(EDITABLE))
    if not_editable:
        raise ScheduleInvalid(
            {
                name[:60]: ["This field cannot be changed; create a new schedule."]
                for name in not_editable
            }
        )
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.source == CODE:
            raise ScheduleInCode(schedule)
        before = Definition.of(schedule)
        after = check_definition(values, base=before)
        changed = {k: v for k, v in after.values().items() if getattr(before, k) != v}
        for name, value in changed.items():
            setattr(schedule, name, value)
        if set(changed) & set(TIMING_FIELDS):
            schedule.next_fire_at = after.timing.next_after(now or db_now())
        schedule.save()
        _record(by, audit.SCHEDULE_UPDATE, schedule, changed=sorted(changed))
    return schedule


def delete_schedule(schedule_id: uuid.UUID | str, *, by: Any = None) -> None:
    """Remove an API schedule and its fire history. Its jobs stay, with ``schedule`` NULL."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.source == CODE:
            raise ScheduleInCode(schedule)
        _record(by, audit.SCHEDULE_DELETE, schedule, **_what(schedule))
        schedule.delete()


def pause_schedule(schedule_id: uuid.UUID | str, *, by: Any = None, reason: str = "") -> Schedule:
    """Stop firing until resumed (a fire in progress in a reaper still completes)."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if not schedule.paused:
            schedule.paused = True
            schedule.save(update_fields=["paused", "updated_at"])
        _record(by, audit.SCHEDULE_PAUSE, schedule, reason)
    return schedule


def resume_schedule(
    schedule_id: uuid.UUID | str,
    *,
    by: Any = None,
    now: datetime | None = None,
    reason: str = "",
) -> Schedule:
    """Fire again from the first slot after now; what was missed while paused is skipped."""
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.paused:
            schedule.paused = False
            schedule.next_fire_at = Timing.of(schedule).next_after(now or db_now())
            schedule.save(update_fields=["paused", "next_fire_at", "updated_at"])
        _record(by, audit.SCHEDULE_RESUME, schedule, reason)
    return schedule


def run_schedule_now(
    schedule_id: uuid.UUID | str,
    *,
    by: Any = None,
    now: datetime | None = None,
    reason: str = "",
) -> Job | Workflow:
    """Fire once now, paused or not and whatever the overlap policy; the job it enqueued
    (for a workflow schedule: the workflow it started).

    Recorded as a ``run_now`` fire at this instant; the schedule's own slots
    are untouched. ``EnqueueError`` (the operation is gone, the payload no
    longer fits its schema) leaves nothing behind.
    """
    with transaction.atomic():
        schedule = _locked(schedule_id)
        fire_at = now or db_now()
        fire_id = None
        for _ in range(5):  # the same microsecond as a slot already fired: the next one
            fire_id = claim_slot(schedule.pk, fire_at, db_now(), RUN_NOW)
            if fire_id is not None:
                break
            fire_at = fire_at + timedelta(microseconds=1)
        if fire_id is None:
            raise ScheduleInvalid({"schedule": ["The schedule fired at this instant; try again."]})
        made = start_for(schedule, fire_at, fire_id=fire_id)
        if schedule.last_fire_at is None or fire_at > schedule.last_fire_at:
            Schedule.objects.filter(pk=schedule.pk).update(last_fire_at=fire_at)
            schedule.last_fire_at = fire_at
        kind = "workflow" if isinstance(made, Workflow) else "job"
        _record(by, audit.SCHEDULE_RUN, schedule, reason, **{kind: str(made.pk)})
    return made
