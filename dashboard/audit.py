"""The audit log as the queues page shows it: rows of ``OperatorAction`` in plain text.

The rows, the action names and their labels are the core's (``jobs.audit``);
what is here only turns a row into what the page prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from jobs.audit import (
    APPLY_SETTINGS,
    BULK_CANCEL,
    BULK_RETRY,
    CANCEL,
    CANCEL_WORKFLOW,
    DISCARD,
    ENQUEUE,
    LABELS,
    REQUEUE_ORPHAN,
    RETRY,
    RUN_NOW,
    SET_CAP,
    SET_KEY_LIMITS,
    SET_RATE_LIMIT,
    SET_RETENTION,
    START_WORKFLOW,
)
from jobs.models import OperatorAction


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
    workflow_id: str | None = None


JOB_ACTIONS = (CANCEL, RETRY, REQUEUE_ORPHAN, RUN_NOW, ENQUEUE)
WORKFLOW_ACTIONS = (CANCEL_WORKFLOW, START_WORKFLOW)


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
                workflow_id=entry.target if entry.action in WORKFLOW_ACTIONS else None,
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
    if entry.action == SET_RETENTION:
        days = described.get("retention_days")
        if not days:
            return "the settings' retention"
        return ", ".join(f"{status} {value:g} d" for status, value in days.items())
    if entry.action == SET_KEY_LIMITS:
        if described.get("deleted"):
            return "removed"
        return ", ".join(
            f"{key} {'none' if value is None else format(value, 'g')}"
            for key, value in described.items()
        )
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
