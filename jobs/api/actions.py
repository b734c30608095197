"""Writes behind the API's operator actions, built on ``jobs.transitions``.

Kept out of the views so the dashboard can call the same functions: bulk
cancel and retry walk the matching jobs in bounded batches (one transaction
per batch, never one huge UPDATE holding locks on a million rows), and
pausing a queue creates its ``Queue`` row on first use.
"""

from __future__ import annotations

from jobs.models import Queue
from jobs.selectors import JobFilters, job_ids_batches
from jobs.states import ACTIVE, CANCELLED, FAILED
from jobs.transitions import cancel_jobs, retry_jobs
from jobs.wakeups import notify_queues

BULK_BATCH_SIZE = 500


def bulk_cancel(
    filters: JobFilters,
    *,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
) -> int:
    """Cancel the queued and running jobs matching ``filters`` (and their descendants).

    Returns how many jobs changed state, cascades included.
    """
    changed = 0
    active = [s.value for s in ACTIVE]
    for ids in job_ids_batches(filters, statuses=active, batch_size=batch_size or BULK_BATCH_SIZE):
        changed += len(cancel_jobs(ids, by=by, reason=reason))
    return changed


def bulk_retry(
    filters: JobFilters,
    *,
    by: str | None = None,
    reason: str | None = None,
    batch_size: int | None = None,
) -> int:
    """Put the failed and cancelled jobs matching ``filters`` back on their queues.

    Returns how many jobs changed state.
    """
    changed = 0
    done = [FAILED.value, CANCELLED.value]
    for ids in job_ids_batches(filters, statuses=done, batch_size=batch_size or BULK_BATCH_SIZE):
        changed += len(retry_jobs(ids, by=by, reason=reason))
    return changed


def set_queue_paused(name: str, paused: bool) -> Queue:
    """Pause or resume claiming on a queue, creating its row (with its default kind) if needed.

    Resuming wakes the queue's waiting workers (PostgreSQL NOTIFY).
    """
    queue, _ = Queue.objects.update_or_create(
        name=name,
        defaults={"paused": paused},
        create_defaults={"paused": paused, "kind": Queue.default_kind(name)},
    )
    if not paused:
        notify_queues([name])
    return queue
