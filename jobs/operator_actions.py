"""Operator actions on queues and job sets: one service per action, each writing its audit row.

The REST API, the dashboard, the Django admin and the ``jobs`` command call
these and add only parsing and rendering, so an action cannot drift between
faces nor skip the audit log (``jobs.audit``). A queue's settings row is
created on first use with its default kind; resuming a queue, or lifting
its rate limit, wakes its waiting workers (PostgreSQL NOTIFY).
"""

from __future__ import annotations

import uuid
from dataclasses import fields
from typing import Any

from django.db import transaction

from jobs import audit, transitions
from jobs.exceptions import ControlPlaneError
from jobs.models import Queue
from jobs.selectors import JobFilters, job_ids_batches
from jobs.states import ACTIVE, CANCELLED, FAILED
from jobs.transitions import cancel_jobs, retry_jobs
from jobs.wakeups import notify_queues

BULK_BATCH_SIZE = 500


def cancel_job(job_id: uuid.UUID, *, user: Any, reason: str | None = None) -> bool:
    """Cancel a queued or running job (and its descendants), audited in the same transaction.

    False if it had already ended (audited with count 0).
    """
    reason = (reason or "").strip()[:500]
    with transaction.atomic():
        changed = transitions.cancel_job(job_id, by=audit.actor_name(user), reason=reason or None)
        audit.record_action(
            user, audit.CANCEL, target=str(job_id), count=int(changed), reason=reason
        )
    return bool(changed)


def retry_job(
    job_id: uuid.UUID, *, user: Any, reason: str | None = None, refusal: bool = False
) -> bool:
    """Put a failed or cancelled job back on its queue, audited even when refused.

    False if it was not retryable; with ``refusal`` the refusal (``IllegalTransition``,
    ``JobNotFound``) is raised instead, after its audit row is written.
    """
    reason = (reason or "").strip()[:500]
    refused: ControlPlaneError | None = None
    with transaction.atomic():
        try:
            with transaction.atomic():  # a refused retry must not undo the audit row
                transitions.retry_job(job_id, by=audit.actor_name(user), reason=reason or None)
        except ControlPlaneError as error:
            refused = error
        audit.record_action(
            user, audit.RETRY, target=str(job_id), count=int(refused is None), reason=reason
        )
    if refused is not None and refusal:
        raise refused
    return refused is None


def set_paused(name: str, paused: bool, *, user: Any = None) -> Queue:
    """Pause or resume claiming on a queue (creating its settings row on first use)."""
    with transaction.atomic():
        queue, _ = Queue.objects.update_or_create(
            name=name,
            defaults={"paused": paused},
            create_defaults={"paused": paused, "kind": Queue.default_kind(name)},
        )
        audit.record_action(user, audit.PAUSE if paused else audit.RESUME, target=name)
    if not paused:
        notify_queues([name])  # waiting workers claim at once instead of at their next poll
    return queue


def set_concurrency_cap(name: str, value: int | None, *, user: Any = None) -> Queue:
    """Set (or clear, with None) the most jobs of a queue running at once."""
    with transaction.atomic():
        queue, _ = Queue.objects.update_or_create(
            name=name,
            defaults={"concurrency_cap": value},
            create_defaults={"concurrency_cap": value, "kind": Queue.default_kind(name)},
        )
        audit.record_action(user, audit.SET_CAP, target=name, filters={"concurrency_cap": value})
    return queue


def set_rate_limit(name: str, value: float | None, *, user: Any = None) -> Queue:
    """Set (or clear, with None) the most jobs of a queue started per second, cluster-wide.

    The bucket keeps its tokens: a lower limit caps them at its own burst on
    the next claim (``jobs.rate_limits``).
    """
    with transaction.atomic():
        queue, _ = Queue.objects.update_or_create(
            name=name,
            defaults={"rate_limit_per_second": value},
            create_defaults={"rate_limit_per_second": value, "kind": Queue.default_kind(name)},
        )
        audit.record_action(
            user, audit.SET_RATE_LIMIT, target=name, filters={"rate_limit_per_second": value}
        )
    if value is None:
        notify_queues([name])  # workers holding off for a token claim at once
    return queue


def _described(filters: JobFilters) -> dict[str, Any]:
    """The filter as the audit log stores it: its set fields, as JSON."""
    described: dict[str, Any] = {}
    for field in fields(filters):
        key, value = field.name, getattr(filters, field.name)
        if value == field.default:
            continue
        if isinstance(value, (list, tuple, set, frozenset)):
            value = sorted(str(v) for v in value)
        elif not isinstance(value, (str, int, float, bool)):
            value = str(value)
        described[key] = value
    return described


def bulk_cancel(
    filters: JobFilters,
    *,
    user: Any = None,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
) -> int:
    """Cancel the queued and running jobs matching ``filters`` (and their descendants).

    Walks them in bounded batches (one transaction each); returns how many
    jobs changed state, cascades included. Audited once, with the filter,
    even when a batch fails midway. ``by`` names the actor in the jobs'
    timelines (default: ``user``'s name).
    """
    return _bulk(filters, cancel=True, user=user, by=by, reason=reason, batch_size=batch_size)


def bulk_retry(
    filters: JobFilters,
    *,
    user: Any = None,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
) -> int:
    """Put the failed and cancelled jobs matching ``filters`` back on their queues (audited)."""
    return _bulk(filters, cancel=False, user=user, by=by, reason=reason, batch_size=batch_size)


def _bulk(
    filters: JobFilters,
    *,
    cancel: bool,
    user: Any,
    by: str | None,
    reason: str | None,
    batch_size: int | None,
) -> int:
    actor = by if by is not None else (audit.actor_name(user) if user is not None else None)
    statuses = [s.value for s in ACTIVE] if cancel else [FAILED.value, CANCELLED.value]
    change = cancel_jobs if cancel else retry_jobs
    changed = 0
    try:
        for ids in job_ids_batches(
            filters, statuses=statuses, batch_size=batch_size or BULK_BATCH_SIZE
        ):
            changed += len(change(ids, by=actor, reason=reason))
    finally:
        audit.record_action(
            user if user is not None else actor,
            audit.BULK_CANCEL if cancel else audit.BULK_RETRY,
            target="filter",
            count=changed,
            filters=_described(filters),
            reason=reason or "",
        )
    return changed
