"""Periodic schedules: cron or fixed-interval jobs (or workflows), fired by the reaper.

- ``timing``: cron (5 or 6 fields), intervals, time zones and the DST rule;
  no database.
- ``definitions``: a schedule's fields checked (``check_definition``).
- ``workflow_check``: a workflow schedule's JSON checked as its fire would
  check it, without storing anything (``workflow_problems``).
- ``firing``: ``fire_due_schedules(now)`` (the reaper's step, safe with many
  reapers), the catch-up policy, ``FireTimer`` and ``prune_fires``.
- ``services``: operator actions (create, update, delete, pause, resume,
  run now), each audited.
- ``selectors``: reads with the last outcome and the fire history.
- ``declared``: schedules declared in code, synced at reaper start.

The names below are importable from here too (lazily, so importing
``jobs.schedules.timing`` pulls in no models).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Timing": "timing",
    "TimingError": "timing",
    "Definition": "definitions",
    "ScheduleInvalid": "definitions",
    "check_definition": "definitions",
    "FireResult": "firing",
    "FireTimer": "firing",
    "fire_due_schedules": "firing",
    "prune_fires": "firing",
    "ScheduleInCode": "services",
    "ScheduleNotFound": "services",
    "create_schedule": "services",
    "update_schedule": "services",
    "delete_schedule": "services",
    "pause_schedule": "services",
    "resume_schedule": "services",
    "run_schedule_now": "services",
    "schedule_get": "selectors",
    "schedule_history": "selectors",
    "schedule_list": "selectors",
    "last_outcome": "selectors",
    "sync_code_schedules": "declared",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'jobs.schedules' has no attribute {name!r}")
    return getattr(importlib.import_module(f"jobs.schedules.{module}"), name)
