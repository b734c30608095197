"""Schedules declared in code, kept in step with ``Schedule`` rows (``source = "code"``).

Two places declare them:

- next to the operation: ``@operation("reports.daily", schedule="0 6 * * *")``
  or ``schedule={"cron": "0 6 * * *", "timezone": "Europe/Berlin",
  "payload": {...}, "catch_up": "all", "overlap": "skip"}`` (also
  ``every_seconds``, ``queue``, ``priority``, ``name``); the schedule is
  named after the operation unless the dict names it;
- in settings: ``CONTROLPLANE["SCHEDULES"] = [{"name": "...", "operation":
  "...", "cron" | "every_seconds": ..., ...}]``.

The reaper syncs them when it starts (``sync_code_schedules``): by name, a
missing row is created, a changed one updated (a new timing fires from the
first slot after now); an operator's pause is kept. A code schedule whose
declaration is gone from the code is deleted, with its fire history; the
jobs it fired stay (their ``schedule`` becomes NULL). A declaration that
does not check out (unknown operation, bad cron) is logged and its row, if
any, left as it was. A schedule created through the API with the same name
is never taken over: the declaration is logged and ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from jobs.clock import db_now
from jobs.conf import knob
from jobs.models import Schedule
from jobs.operations import registry
from jobs.schedules.definitions import TIMING_FIELDS, Definition, ScheduleInvalid, check_definition

log = logging.getLogger("jobs.schedules")

CODE = "code"


@dataclass
class SyncResult:
    created: int = 0
    updated: int = 0
    deleted: int = 0
    invalid: int = 0

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def declared_schedules() -> list[dict[str, Any]]:
    """Every schedule the code declares, as definition values (unchecked), operations first."""
    found: list[dict[str, Any]] = []
    for op in registry.all():
        declared = getattr(op, "schedule", None)
        if declared is None:
            continue
        values = {"cron": declared} if isinstance(declared, str) else dict(declared)
        values.setdefault("name", op.name)
        values["operation"] = op.name
        found.append(values)
    for entry in knob("SCHEDULES") or []:
        found.append(dict(entry) if isinstance(entry, dict) else {"invalid": entry})
    return found


def sync_code_schedules(now: datetime | None = None) -> SyncResult:
    """Create, update and delete ``source = "code"`` rows to match the declarations."""
    now = now or db_now()
    result = SyncResult()
    names: set[str] = set()
    for values in declared_schedules():
        name = values.get("name")
        if isinstance(name, str):
            names.add(name)
        try:
            definition = check_definition(values)
        except ScheduleInvalid as error:
            result.invalid += 1
            log.error("schedule.declaration_invalid name=%r errors=%s", name, error.errors)
            continue
        _sync_one(definition, now, result)
    doomed = Schedule.objects.filter(source=CODE).exclude(name__in=names)
    gone = list(doomed.values_list("name", flat=True))
    if gone:
        result.deleted = doomed.delete()[1].get(Schedule._meta.label, 0)
        log.info("schedule.removed_from_code names=%s", ",".join(gone))
    if result.created or result.updated or result.deleted or result.invalid:
        log.info("schedule.synced %s", result)
    return result


def _sync_one(definition: Definition, now: datetime, result: SyncResult) -> None:
    with transaction.atomic():
        row = Schedule.objects.select_for_update().filter(name=definition.name).first()
        if row is None:
            try:
                with transaction.atomic():
                    Schedule.objects.create(
                        **definition.values(),
                        source=CODE,
                        next_fire_at=definition.timing.next_after(now),
                    )
                result.created += 1
            except IntegrityError:  # another reaper starting at the same moment made it
                pass
            return
        if row.source != CODE:
            log.warning(
                "schedule.name_taken name=%r: a schedule made through the API has this name; "
                "the declaration in code is ignored (rename one of them)",
                definition.name,
            )
            return
        current = Definition.of(row)
        changed = {k: v for k, v in definition.values().items() if getattr(current, k) != v}
        if not changed:
            return
        for field_name, value in changed.items():
            setattr(row, field_name, value)
        if set(changed) & set(TIMING_FIELDS):
            row.next_fire_at = definition.timing.next_after(now)
        row.save()
        result.updated += 1
