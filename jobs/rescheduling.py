"""Changing when a queued job runs: not a state change, but written like one.

``run_job_now`` moves a waiting job's ``run_after`` to now. The job stays
``queued`` (the state table in ``jobs.states`` is not involved), yet the
write is ``jobs.transitions.rewrite``, the status writes' own guarded UPDATE:
it takes the next event ``seq`` from the job row and writes its ``JobEvent``
in the same transaction; a clear exception follows when the guard matches
nothing, and the queue's workers are woken as an enqueue wakes them.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import transaction

from jobs.clock import db_now
from jobs.dialect import dialect
from jobs.events import JOB_RUN_NOW
from jobs.exceptions import ControlPlaneError, JobNotFound
from jobs.models import Job
from jobs.states import QUEUED
from jobs.transitions import Event, Moved, notify_job_queues, rewrite


class NotWaiting(ControlPlaneError):
    """The job is not queued for a later time, so there is nothing to bring forward."""

    def __init__(self, job_id: object, status: str, run_after: datetime | None) -> None:
        self.job_id, self.status, self.run_after = job_id, status, run_after
        if status == QUEUED and run_after is None:
            why = "it waits for its dependencies, which decide when it runs"
        else:
            why = "it is already due" if status == QUEUED else f"it is {status}"
        super().__init__(
            f"Job {job_id} is not waiting for a later time ({why}); only a queued job "
            "whose run_after is in the future can be run now."
        )


def run_job_now(
    job_id: uuid.UUID,
    *,
    by: str | None = None,
    reason: str | None = None,
    using: str = "default",
) -> Moved:
    """A queued job whose ``run_after`` is in the future becomes claimable at once.

    Writes ``job.run_now`` (with ``by``, ``reason`` and the time it was due)
    in the same transaction and notifies the job's queue, so an idle worker
    claims it within milliseconds on PostgreSQL. Raises ``JobNotFound`` or
    ``NotWaiting`` (nothing written) when the guard does not match: the job
    was claimed, cancelled or brought forward by someone else meanwhile.
    """
    now = db_now(using)
    with transaction.atomic(using=using):
        # Locked first (PostgreSQL) so the time it was due, read here, is the
        # one the guarded UPDATE below replaces.
        before = (
            Job.objects.using(using)
            .select_for_update()
            .filter(pk=job_id)
            .values_list("status", "run_after")
            .first()
        )
        if before is None:
            raise JobNotFound(job_id)
        status, due = before
        if due is None:  # waiting for its dependencies (jobs.dependencies)
            raise NotWaiting(job_id, status, due)
        fields: dict[str, Any] = {"was_due": due.isoformat()}
        fields.update({k: v for k, v in {"by": by, "reason": reason}.items() if v})
        moved = rewrite(
            status_in=(QUEUED,),
            job_ids=[job_id],
            where="run_after > %s",
            where_params=[dialect(using).ts(now)],
            assign={"run_after": now},
            event=Event(JOB_RUN_NOW, message=reason or "", fields=fields),
            at=now,
            using=using,
        )
        if not moved:
            raise NotWaiting(job_id, status, due)
        notify_job_queues([job_id], using=using)  # delivered at commit
    return moved[0]
