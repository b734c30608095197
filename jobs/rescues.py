"""Rescues run by the reaper: expired leases, gone workers, timed-out jobs.

The guard of every rescue stands in the UPDATE itself (rechecked by
PostgreSQL on the row it finally locks), so several reapers never act twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from jobs import events
from jobs.dialect import Now, dialect
from jobs.states import FAILED, QUEUED, RUNNING
from jobs.tables import JOB_TABLE
from jobs.transitions import (
    CLEAR_LEASE,
    DECREMENT_ATTEMPTS,
    RESET_STARTED_AT,
    Event,
    Sql,
    move,
    notify_job_queues,
)

# --- rescues by the reaper ------------------------------------------------


def requeue_expired_leases(
    *, max_requeues: int, worker_ids: Sequence[uuid.UUID] = (), limit: int = 500
) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    """Handle running jobs whose lease has passed (or whose worker is gone).

    Requeues those under the ``max_requeues`` budget (``job.lease_expired_requeue``)
    and fails the rest with ``LeaseExpired`` (``job.lease_expired``). The
    guard is in the UPDATE itself, so two reapers never act twice.

    Only jobs a worker holds (``lease_token IS NOT NULL``) are touched: a
    deferred parent is held by its batches, not by a lease, so neither an
    expiry nor the sweep of the worker that ran its coordinator may requeue it.

    The budget is the ``lease_requeues`` column, one per
    ``job.lease_expired_requeue`` event since the last operator retry (which
    resets it with the rest of the attempt budget): an operator retrying a job
    that died of lease expiries expects it to get its full budget again.
    The requeued jobs' queues are notified so idle workers claim them at once.
    Leases are compared with the database's clock, as they were written.
    """
    d = dialect()
    now_sql, now_params = d.now()
    expiry = f"lease_token IS NOT NULL AND (leased_until < {now_sql}"
    expiry_params: list[Any] = [*now_params]
    if worker_ids:
        expiry += f" OR worker_id IN {d.in_list(len(worker_ids))}"
        expiry_params += [d.uuid(w) for w in worker_ids]
    expiry += ")"
    # The conditions stand in the outer WHERE too: PostgreSQL rechecks them on
    # the row it finally locks, so a job claimed again meanwhile is left alone.
    pick = (
        f"{expiry} AND lease_requeues {{op}} %s AND id IN (SELECT id FROM {JOB_TABLE} "
        f"WHERE status = 'running' AND {expiry} AND lease_requeues {{op}} %s LIMIT {int(limit)})"
    )
    requeued = move(
        target=QUEUED,
        sources=(RUNNING,),  # never resurrect a cancelled or failed job
        where=pick.format(op="<"),
        where_params=[*expiry_params, max_requeues, *expiry_params, max_requeues],
        event=Event(
            events.JOB_LEASE_EXPIRED_REQUEUE,
            level="warning",
            message="lease expired; requeued",
        ),
        assign={
            **CLEAR_LEASE,
            "lease_requeues": Sql("lease_requeues + 1"),
            "attempts": DECREMENT_ATTEMPTS,
            "run_after": Now(),
            "worker_id": None,
            "started_at": RESET_STARTED_AT,
        },
    )
    notify_job_queues([m.id for m in requeued])
    failed = move(
        target=FAILED,
        where=pick.format(op=">="),
        where_params=[*expiry_params, max_requeues, *expiry_params, max_requeues],
        event=Event(
            events.JOB_LEASE_EXPIRED,
            level="error",
            message=f"lease expired more than {max_requeues} times",
            fields={"error_code": "LeaseExpired"},
        ),
        assign={
            **CLEAR_LEASE,
            "finished_at": Now(),
            "error_code": "LeaseExpired",
            "error_message": f"The job's lease expired more than {max_requeues} times.",
        },
    )
    return [m.id for m in requeued], [m.id for m in failed]


def fail_timed_out(
    *, timeout_seconds: float, stall_seconds: float, limit: int = 500
) -> list[uuid.UUID]:
    """Fail jobs running longer than the timeout that also wrote no event for ``stall_seconds``."""
    d = dialect()
    started_sql, started_params = d.now(-timeout_seconds)
    stalled_sql, stalled_params = d.now(-stall_seconds)
    stale = (
        f"started_at < {started_sql} AND (last_event_at IS NULL OR last_event_at < {stalled_sql})"
    )
    stale_params = [*started_params, *stalled_params]
    message = f"Ran longer than {timeout_seconds:g} s with no event for {stall_seconds:g} s."
    moved = move(
        target=FAILED,
        where=(
            f"{stale} AND id IN (SELECT id FROM {JOB_TABLE} WHERE status = 'running' AND {stale} "
            f"LIMIT {int(limit)})"
        ),
        where_params=stale_params * 2,
        event=Event(
            events.JOB_TIMEOUT, level="error", message=message, fields={"error_code": "JobTimeout"}
        ),
        assign={
            **CLEAR_LEASE,
            "finished_at": Now(),
            "error_code": "JobTimeout",
            "error_message": message,
        },
    )
    return [m.id for m in moved]
