"""Operator actions on one job or one queue: one service per action, each writing its audit row.

The REST API, the dashboard, the Django admin and the ``jobs`` command call
these and add only parsing and rendering, so an action cannot drift between
faces nor skip the audit log (``jobs.audit``). Every job change goes through
``jobs.transitions``, so it is guarded and leaves an event carrying the
operator's name (``by``) and reason; the audit row is written in the same
transaction where the change is a single write. A queue's settings row is
created on first use with its default kind; resuming a queue, or lifting
its rate limit, wakes its waiting workers (PostgreSQL NOTIFY). Actions on
sets of jobs are in ``jobs.bulk_actions``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import OperationalError, connection, transaction

from jobs import audit, transitions
from jobs.exceptions import ControlPlaneError, JobNotFound
from jobs.models import Job, KeyLimit, Queue
from jobs.rescheduling import NotWaiting, run_job_now
from jobs.selectors.workers import live_worker_ids
from jobs.states import RUNNING, TERMINAL
from jobs.wakeups import notify_queues

REASON_MAX = 500
DEADLOCK_ATTEMPTS = 3


def normalise_reason(reason: str | None) -> str:
    """An operator's reason as every face stores it: trimmed, at most ``REASON_MAX`` characters."""
    return (reason or "").strip()[:REASON_MAX]


def cancel_job(job_id: uuid.UUID, *, user: Any, reason: str | None = None) -> bool:
    """Cancel a queued or running job (and its descendants), audited in the same transaction.

    False if it had already ended (audited with count 0).
    """
    reason = normalise_reason(reason)
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
    reason = normalise_reason(reason)
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


def cancel_workflow(workflow_id: uuid.UUID, *, user: Any, reason: str | None = None) -> int:
    """Cancel a workflow's queued and running steps (the workflow ``cancelled``), audited.

    Returns how many steps changed (0 when it had already ended; audited too).
    ``Workflow.DoesNotExist`` when there is no such workflow.
    """
    from jobs.models import Workflow
    from jobs.workflows import cancel_workflow as cancel_steps

    reason = normalise_reason(reason)
    attempt = 0
    while True:
        try:
            with transaction.atomic():
                Workflow.objects.get(pk=workflow_id)
                changed = cancel_steps(
                    workflow_id, by=audit.actor_name(user), reason=reason or None
                )
                audit.record_action(
                    user,
                    audit.CANCEL_WORKFLOW,
                    target=str(workflow_id),
                    count=changed,
                    reason=reason,
                )
            return changed
        except OperationalError as error:
            # Steps ending meanwhile lock their jobs, then the workflow; this locks the
            # workflow, then its steps. PostgreSQL breaks such a cycle: try again.
            attempt += 1
            deadlock = getattr(error.__cause__, "sqlstate", None) == "40P01"
            if not deadlock or attempt >= DEADLOCK_ATTEMPTS:
                raise


def requeue_orphan(job_id: uuid.UUID, *, user: Any) -> bool:
    """Requeue a running job whose worker is stale or gone. False if it is no longer orphaned.

    Checked again here, not only where the job was shown: the worker may have
    come back since, and a live worker's job must not be taken away.
    """
    by = audit.actor_name(user)
    job = (
        Job.objects.filter(pk=job_id, status=RUNNING, lease_token__isnull=False)
        .only("id", "worker_id")
        .first()
    )
    changed = False
    if job is not None and not (job.worker_id and job.worker_id in set(live_worker_ids())):
        reason = f"requeued by {by} from the dashboard: its worker is stale or gone"
        try:
            with transaction.atomic():
                transitions.requeue_job(job.pk, lease_token=None, reason=reason, by=by)
                audit.record_action(user, audit.REQUEUE_ORPHAN, target=str(job_id), count=1)
            changed = True
        except ControlPlaneError:
            pass
    if not changed:
        audit.record_action(user, audit.REQUEUE_ORPHAN, target=str(job_id), count=0)
    return changed


def run_now(job_id: uuid.UUID, *, user: Any, reason: str | None = None) -> bool:
    """Make a job waiting for a later time (scheduled, or a retry's backoff) claimable now.

    False if it was not waiting (already due, claimed or ended); the audit row
    is written either way, as for a refused retry. ``JobNotFound`` propagates.
    """
    reason = normalise_reason(reason)
    with transaction.atomic():
        try:
            with transaction.atomic():  # a refusal must not undo the audit row
                run_job_now(job_id, by=audit.actor_name(user), reason=reason or None)
            changed = True
        except NotWaiting:
            changed = False
        audit.record_action(
            user, audit.RUN_NOW, target=str(job_id), count=int(changed), reason=reason
        )
    return changed


# Most descendants one discard deletes with its job; a bigger tree is left
# to the reaper's retention, which deletes in batches.
DISCARD_MAX_DESCENDANTS = 1000


@dataclass(frozen=True)
class Discard:
    """What a discard did: ``deleted`` jobs (the job and its descendants), or why none."""

    deleted: int = 0
    refused: str = ""


def _descendant_ids(job_id: uuid.UUID, limit: int) -> list[Any]:
    """Ids of every job below ``job_id`` (children, grandchildren…), at most ``limit``."""
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE tree(id) AS (SELECT id FROM {table} WHERE parent_id = %s "
            f"UNION SELECT j.id FROM {table} j JOIN tree t ON j.parent_id = t.id) "
            "SELECT id FROM tree LIMIT %s",
            [Job._meta.pk.get_db_prep_value(job_id, connection), limit],
        )
        return [row[0] for row in cursor.fetchall()]


def discard_job(job_id: uuid.UUID, *, user: Any, reason: str = "") -> Discard:
    """Delete a finished job with its timeline, batch rows and finished descendants.

    Refused (nothing deleted) while the job is queued or running, or while
    any job below it is: deleting a parent deletes its children, as the
    reaper's retention would once they had all finished. The job and every
    descendant are locked (PostgreSQL; SQLite's IMMEDIATE transaction holds
    the write lock) before their statuses are checked, and the tree is read
    again under the locks, so a retry or a new child landing meanwhile is
    seen rather than deleted. The audit row, written either way, names the
    job's operation and status in its ``filter``, as the job itself is gone.
    ``JobNotFound`` propagates.
    """
    reason = normalise_reason(reason)
    with transaction.atomic():
        job = (
            Job.objects.select_for_update()
            .filter(pk=job_id)
            .values("status", "operation", "queue")
            .first()
        )
        if job is None:
            raise JobNotFound(job_id)
        refused, below = _discard_check(job_id, job["status"])
        deleted = 0
        if not refused:
            _, per_model = Job.objects.filter(pk__in=[job_id, *below]).delete()
            deleted = per_model.get(Job._meta.label, 0)
        described = {**job, "descendants": len(below)}
        if refused:
            described["refused"] = refused
        audit.record_action(
            user, audit.DISCARD, target=str(job_id), count=deleted, filters=described, reason=reason
        )
    return Discard(deleted=deleted, refused=refused)


def _discard_check(job_id: uuid.UUID, status: str) -> tuple[str, list[Any]]:
    """Why the job may not be discarded (and no ids), or "" and its locked descendants."""
    terminal = {s.value for s in TERMINAL}
    if status not in terminal:
        return (
            f"Only a finished job can be discarded; this one is {status}. "
            "Cancel it first, or wait for it to finish."
        ), []
    found = _descendant_ids(job_id, DISCARD_MAX_DESCENDANTS + 1)
    if len(found) > DISCARD_MAX_DESCENDANTS:
        return (
            f"This job has more than {DISCARD_MAX_DESCENDANTS:,} descendants; "
            "the reaper's retention deletes a tree that big in batches."
        ), []
    statuses = Job.objects.select_for_update().filter(pk__in=found).values_list("status", flat=True)
    unfinished = sum(1 for s in statuses if s not in terminal)
    if unfinished:
        return (
            f"{_plural(unfinished, 'job')} below this one "
            f"{'is' if unfinished == 1 else 'are'} not finished; cancel them or wait for them "
            "first (discarding a parent deletes its children)."
        ), []
    if set(_descendant_ids(job_id, DISCARD_MAX_DESCENDANTS + 1)) != set(found):
        return "A child job was added meanwhile; nothing was deleted. Try again.", []
    return "", found


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _set_queue_setting(
    name: str, field: str, value: Any, action: str, *, user: Any, audited: bool = True
) -> Queue:
    """One queue setting (its row made on first use) and its audit row, in one transaction."""
    with transaction.atomic():
        queue, _ = Queue.objects.update_or_create(
            name=name,
            defaults={field: value},
            create_defaults={field: value, "kind": Queue.default_kind(name)},
        )
        audit.record_action(user, action, target=name, filters={field: value} if audited else None)
    return queue


def set_paused(name: str, paused: bool, *, user: Any = None) -> Queue:
    """Pause or resume claiming on a queue (creating its settings row on first use)."""
    queue = _set_queue_setting(
        name, "paused", paused, audit.PAUSE if paused else audit.RESUME, user=user, audited=False
    )
    if not paused:
        notify_queues([name])  # waiting workers claim at once instead of at their next poll
    return queue


def set_concurrency_cap(name: str, value: int | None, *, user: Any = None) -> Queue:
    """Set (or clear, with None) the most jobs of a queue running at once."""
    return _set_queue_setting(name, "concurrency_cap", value, audit.SET_CAP, user=user)


def set_rate_limit(name: str, value: float | None, *, user: Any = None) -> Queue:
    """Set (or clear, with None) the most jobs of a queue started per second, cluster-wide.

    The bucket keeps its tokens: a lower limit caps them at its own burst on
    the next claim (``jobs.rate_limits``).
    """
    queue = _set_queue_setting(
        name, "rate_limit_per_second", value, audit.SET_RATE_LIMIT, user=user
    )
    if value is None:
        notify_queues([name])  # workers holding off for a token claim at once
    return queue


def set_queue_retention(name: str, value: Any, *, user: Any = None) -> Queue:
    """Set a queue's retention by status (``jobs.retention.check_queue_retention``: days
    for every status, or by status; None returns the queue to the settings' retention),
    audited. ``RetentionError`` says what is wrong with ``value``.

    The reaper reads it at its next pass; it wins over ``QUEUE_RETENTION_DAYS``.
    """
    from jobs.retention import check_queue_retention

    checked = check_queue_retention(value)
    return _set_queue_setting(name, "retention_days", checked, audit.SET_RETENTION, user=user)


def set_key_limits(name: str, values: dict[str, Any], *, user: Any = None) -> KeyLimit:
    """Set the limits of a key family (``account``) or of one key (``account:42``), audited.

    ``values`` holds any of ``concurrency``, ``rate``, ``burst`` and ``weight``
    (``jobs.key_limits.check_limits``: ``KeyLimitError`` names each field out
    of its rule; None clears a field). Fields not named keep their values.
    Claims see the change within ``QUEUE_SETTINGS_CACHE_SECONDS`` (this
    process: at once); a worker waiting for a token or for room tries again
    at its next poll.
    """
    from jobs.key_limits import cache, check_limits, check_name

    name = check_name(name)
    checked = check_limits(values, partial=False)
    with transaction.atomic():
        row, _ = KeyLimit.objects.get_or_create(name=name)
        for field, value in checked.items():
            setattr(row, field, value)
        row.save()
        audit.record_action(user, audit.SET_KEY_LIMITS, target=name, filters=checked)
    cache.forget()
    return row


def delete_key_limits(name: str, *, user: Any = None) -> bool:
    """Remove a family's or a key's own limits (a key then obeys its family's), audited."""
    from jobs.key_limits import cache

    with transaction.atomic():
        deleted, _ = KeyLimit.objects.filter(name=name).delete()
        if deleted:
            audit.record_action(user, audit.SET_KEY_LIMITS, target=name, filters={"deleted": True})
    cache.forget()
    return bool(deleted)
