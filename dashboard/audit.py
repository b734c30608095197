"""The operators' audit log: one ``OperatorAction`` row per dashboard action.

Every action the dashboard offers (cancel, retry, bulk cancel/retry, pause,
resume, concurrency cap, rate limit, orphan requeue) writes a row naming who did it, to
what, how many jobs changed and why, in the same transaction as the change
where the change is a single write. Job timelines already carry ``by`` on
their events; this log also covers queue settings, which have no timeline,
and records a bulk action once, with the filter it used.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from dashboard.permissions import actor_name
from jobs.models import OperatorAction

CANCEL = "cancel"
RETRY = "retry"
BULK_CANCEL = "bulk_cancel"
BULK_RETRY = "bulk_retry"
PAUSE = "pause"
RESUME = "resume"
SET_CAP = "set_cap"
SET_RATE_LIMIT = "set_rate_limit"
APPLY_SETTINGS = "queue_settings"  # CONTROLPLANE["QUEUES"] applied at start (jobs.queue_limits)
REQUEUE_ORPHAN = "requeue_orphan"
PURGE = "purge"  # manage.py jobs purge
RUN_NOW = "run_now"
DISCARD = "discard"  # target: the deleted job's id; filter: what it was
ENQUEUE = "enqueue"  # the operations page's form
# Schedules (jobs.schedules.services): target is the schedule's name, filter its id.
SCHEDULE_CREATE = "schedule_create"
SCHEDULE_UPDATE = "schedule_update"
SCHEDULE_DELETE = "schedule_delete"
SCHEDULE_PAUSE = "schedule_pause"
SCHEDULE_RESUME = "schedule_resume"
SCHEDULE_RUN = "schedule_run"

LABELS = {
    CANCEL: "Cancelled",
    RETRY: "Retried",
    BULK_CANCEL: "Bulk cancel",
    BULK_RETRY: "Bulk retry",
    PAUSE: "Paused",
    RESUME: "Resumed",
    SET_CAP: "Concurrency cap",
    SET_RATE_LIMIT: "Rate limit",
    APPLY_SETTINGS: "Queue settings applied",
    REQUEUE_ORPHAN: "Requeued orphan",
    PURGE: "Purged finished jobs",
    RUN_NOW: "Run now",
    DISCARD: "Discarded",
    ENQUEUE: "Enqueued",
    SCHEDULE_CREATE: "Schedule created",
    SCHEDULE_UPDATE: "Schedule changed",
    SCHEDULE_DELETE: "Schedule deleted",
    SCHEDULE_PAUSE: "Schedule paused",
    SCHEDULE_RESUME: "Schedule resumed",
    SCHEDULE_RUN: "Schedule run now",
}


def record_action(
    user: Any,
    action: str,
    *,
    target: str = "",
    count: int = 0,
    filters: dict[str, Any] | None = None,
    reason: str = "",
) -> OperatorAction:
    """Write one audit row. ``user`` may be None (a script); the name is copied either way."""
    authenticated = user is not None and getattr(user, "is_authenticated", False)
    return OperatorAction.objects.create(
        user=user if authenticated else None,
        username=actor_name(user)[:150],
        action=action,
        target=str(target)[:255],
        count=int(count),
        filter=filters or {},
        reason=(reason or "")[:2000],
    )


def recent_actions(limit: int = 20) -> QuerySet[OperatorAction]:
    """The newest actions first (the ``at`` index serves it)."""
    return OperatorAction.objects.order_by("-at", "-id")[:limit]


@dataclass(frozen=True)
class ActionRow:
    """One audit entry as the queues page shows it (plain text: the template escapes)."""

    at: datetime
    username: str
    label: str
    target: str
    job_id: str | None
    count: int
    detail: str
    reason: str


JOB_ACTIONS = (CANCEL, RETRY, REQUEUE_ORPHAN, RUN_NOW, ENQUEUE)


def recent_rows(limit: int = 15) -> list[ActionRow]:
    rows = []
    for entry in recent_actions(limit):
        rows.append(
            ActionRow(
                at=entry.at,
                username=entry.username or "—",
                label=LABELS.get(entry.action, entry.action),
                target="" if entry.action in (BULK_CANCEL, BULK_RETRY) else entry.target,
                job_id=entry.target if entry.action in JOB_ACTIONS else None,
                count=entry.count,
                detail=_detail(entry),
                reason=entry.reason,
            )
        )
    return rows


def _detail(entry: OperatorAction) -> str:
    described = entry.filter or {}
    if entry.action == SET_CAP:
        cap = described.get("concurrency_cap")
        return "no cap" if cap is None else f"cap {cap}"
    if entry.action == SET_RATE_LIMIT:
        rate = described.get("rate_limit_per_second")
        return "no rate limit" if rate is None else f"{rate:g} jobs/s"
    if entry.action == APPLY_SETTINGS:
        return ", ".join(f"{key}={value}" for key, value in described.items())
    if entry.action == DISCARD:
        return " ".join(str(described.get(k, "")) for k in ("operation", "status")).strip()
    if entry.action not in (BULK_CANCEL, BULK_RETRY):
        return ""
    if described.get("scope") == "selected":
        return f"{len(described.get('ids', []))} selected"
    parts = [
        f"{key}={','.join(value) if isinstance(value, list) else value}"
        for key, value in described.items()
        if key != "scope"
    ]
    return "filter " + (" ".join(parts) if parts else "(every job)")
