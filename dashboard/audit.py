"""The audit log as the dashboard shows it: labels and rows of ``OperatorAction``.

The rows are written by ``jobs.audit`` (one service for every face: API,
dashboard, admin, ``jobs`` command); its names are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from jobs.audit import (
    ADMIN_CHANGE,
    APPLY_SETTINGS,
    BULK_CANCEL,
    BULK_RETRY,
    CANCEL,
    DECLARE_OPERATION,
    DISCARD,
    ENQUEUE,
    PAUSE,
    PURGE,
    REDECLARE_OPERATION,
    REQUEUE_ORPHAN,
    RESUME,
    RETRY,
    RUN_NOW,
    SCHEDULE_CREATE,
    SCHEDULE_DELETE,
    SCHEDULE_PAUSE,
    SCHEDULE_RESUME,
    SCHEDULE_RUN,
    SCHEDULE_UPDATE,
    SET_CAP,
    SET_RATE_LIMIT,
    record_action,
)
from jobs.models import OperatorAction

__all__ = [
    "ADMIN_CHANGE",
    "APPLY_SETTINGS",
    "BULK_CANCEL",
    "BULK_RETRY",
    "CANCEL",
    "DECLARE_OPERATION",
    "DISCARD",
    "ENQUEUE",
    "LABELS",
    "PAUSE",
    "PURGE",
    "REDECLARE_OPERATION",
    "REQUEUE_ORPHAN",
    "RESUME",
    "RETRY",
    "RUN_NOW",
    "SCHEDULE_CREATE",
    "SCHEDULE_DELETE",
    "SCHEDULE_PAUSE",
    "SCHEDULE_RESUME",
    "SCHEDULE_RUN",
    "SCHEDULE_UPDATE",
    "SET_CAP",
    "SET_RATE_LIMIT",
    "ActionRow",
    "record_action",
    "recent_actions",
    "recent_rows",
]

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
    DECLARE_OPERATION: "Operation declared",
    REDECLARE_OPERATION: "Operation redeclared",
    ADMIN_CHANGE: "Changed in the admin",
}


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
