"""The operators' audit log: one ``OperatorAction`` row per operator action, whichever face made it.

Every action an operator can take (cancel, retry, bulk cancel/retry, pause,
resume, concurrency cap, rate limit, retention, orphan requeue, schedules, a remote
operation's declaration, a change made through the Django admin) writes a row
naming who did it, to what, how many jobs changed and why, in the same
transaction as the change where the change is a single write. Job timelines
already carry ``by`` on their events; this log also covers queue settings,
which have no timeline, and records a bulk action once, with the filter it used.
The API, the dashboard, the admin and the ``jobs`` command all write through
``record_action``; ``LABELS`` names each action for people (the dashboard's
log, the admin's filter), so every face calls an action the same.
"""

from __future__ import annotations

from typing import Any

from jobs.models import OperatorAction

CANCEL = "cancel"
RETRY = "retry"
BULK_CANCEL = "bulk_cancel"
BULK_RETRY = "bulk_retry"
PAUSE = "pause"
RESUME = "resume"
SET_CAP = "set_cap"
SET_RATE_LIMIT = "set_rate_limit"
SET_RETENTION = "set_retention"  # a queue's retention by status (jobs.retention)
APPLY_SETTINGS = "queue_settings"  # CONTROLPLANE["QUEUES"] applied at start (jobs.queue_limits)
# Flow key limits (jobs.key_limits): target is the family or key, filter the limits set.
SET_KEY_LIMITS = "set_key_limits"
APPLY_KEY_SETTINGS = "key_settings"  # limits declared in code applied at start
REQUEUE_ORPHAN = "requeue_orphan"
PURGE = "purge"  # manage.py jobs purge
RUN_NOW = "run_now"
CANCEL_WORKFLOW = "cancel_workflow"  # target: the workflow's id; count: steps cancelled
START_WORKFLOW = "start_workflow"  # a workflow enqueued by an operator (REST, dashboard)
DISCARD = "discard"  # target: the deleted job's id; filter: what it was
ENQUEUE = "enqueue"  # the operations page's form
# Schedules (jobs.schedules.services): target is the schedule's name, filter its id.
SCHEDULE_CREATE = "schedule_create"
SCHEDULE_UPDATE = "schedule_update"
SCHEDULE_DELETE = "schedule_delete"
SCHEDULE_PAUSE = "schedule_pause"
SCHEDULE_RESUME = "schedule_resume"
SCHEDULE_RUN = "schedule_run"

# Remote operations (django_controlplane.remote.workers): target is the operation's name,
# filter its declaration (and the one it replaced).
DECLARE_OPERATION = "declare_operation"
REDECLARE_OPERATION = "redeclare_operation"
# A change made through the Django admin (django_controlplane.admin): target is the object,
# filter the model and the changed fields.
ADMIN_CHANGE = "admin_change"

# Each action as people read it in a log.
LABELS: dict[str, str] = {
    CANCEL: "Cancelled",
    RETRY: "Retried",
    BULK_CANCEL: "Bulk cancel",
    BULK_RETRY: "Bulk retry",
    PAUSE: "Paused",
    RESUME: "Resumed",
    SET_CAP: "Concurrency cap",
    SET_RATE_LIMIT: "Rate limit",
    SET_RETENTION: "Retention",
    APPLY_SETTINGS: "Queue settings applied",
    SET_KEY_LIMITS: "Key limits",
    APPLY_KEY_SETTINGS: "Key limits applied",
    REQUEUE_ORPHAN: "Requeued orphan",
    PURGE: "Purged finished jobs",
    RUN_NOW: "Run now",
    CANCEL_WORKFLOW: "Workflow cancelled",
    START_WORKFLOW: "Workflow started",
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


def actor_name(user: Any) -> str:
    """How an operator is named: a plain name stands for itself (``jobs --by``)."""
    if isinstance(user, str):
        return user
    return user.get_username() if user and user.is_authenticated else "anonymous"


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


def apply_declared(
    model: Any, name: str, wanted: dict[str, Any], *, action: str, defaults: dict | None = None
) -> bool:
    """Write a settings row's declared values unless they are the ones last applied.

    For what code declares (``QUEUES``, ``KEYS``): under the row's lock, so
    processes starting together apply a declaration once, and each
    application is an audit row (``action``, by ``settings``) that the next
    start compares against; an operator's change in between stands until the
    declaration itself changes. Returns whether it wrote.
    """
    from django.db import transaction

    with transaction.atomic():
        model.objects.get_or_create(name=name, defaults=defaults or {})
        row = model.objects.select_for_update().get(name=name)
        last = (
            OperatorAction.objects.filter(action=action, target=name)
            .order_by("-at", "-id")
            .values_list("filter", flat=True)
            .first()
        )
        if last == wanted:
            return False
        for field, value in wanted.items():
            setattr(row, field, value)
        row.save(update_fields=[*wanted, "updated_at"])
        record_action("settings", action, target=name, filters=wanted)
    return True
