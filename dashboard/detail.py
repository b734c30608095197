"""Reads for one job's page: its facts, parent and children, progress and timeline.

The timeline is read by ``seq`` on the unique ``(job, seq)`` index, newest
page first; ``events_after`` is the cursor live updates and polling share.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from dashboard.conf import setting
from dashboard.db import Count, capped_count
from dashboard.selectors import LIST_FIELDS, STATES, stale_before
from jobs.models import Job, JobEvent, Worker
from jobs.states import RUNNING


@dataclass
class Progress:
    current: int
    total: int | None
    percent: float | None
    eta: datetime | None


def progress_of(job: Job, now: datetime | None = None) -> Progress | None:
    """The progress bar's figures; the finish estimate assumes the rate so far holds."""
    total, current = job.progress_total, job.progress_current or 0
    if not total and not current:
        return None
    percent = min(100.0, 100.0 * current / total) if total else None
    eta = None
    if job.status == RUNNING and job.started_at and total and 0 < current < total:
        elapsed = ((now or timezone.now()) - job.started_at).total_seconds()
        eta = (now or timezone.now()) + timedelta(seconds=elapsed * (total - current) / current)
    return Progress(current=current, total=total, percent=percent, eta=eta)


@dataclass
class JobDetail:
    job: Job
    worker: Worker | None
    worker_stale: bool
    parent: Job | None
    children: list[Job]
    child_counts: dict[str, Count]
    progress: Progress | None

    @property
    def child_total(self) -> int:
        return sum(c.value for c in self.child_counts.values())

    @property
    def has_children(self) -> bool:
        return any(c.value for c in self.child_counts.values())


def job_detail(job_id: uuid.UUID | str) -> JobDetail | None:
    """Everything the job page shows except the timeline (see ``timeline``)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    worker = Worker.objects.filter(pk=job.worker_id).first() if job.worker_id else None
    parent = (
        Job.objects.only("id", "operation", "status", "queue").filter(pk=job.parent_id).first()
        if job.parent_id
        else None
    )
    kids = Job.objects.filter(parent_id=job.pk)
    child_counts = {s: capped_count(kids.filter(status=s)) for s in STATES}
    children = (
        list(kids.only(*LIST_FIELDS).order_by("created_at", "id")[: int(setting("CHILDREN_SHOWN"))])
        if any(c.value for c in child_counts.values())
        else []
    )
    return JobDetail(
        job=job,
        worker=worker,
        worker_stale=bool(worker and worker.last_heartbeat < stale_before()),
        parent=parent,
        children=children,
        child_counts=child_counts,
        progress=progress_of(job),
    )


def timeline(
    job_id: uuid.UUID, *, before: int | None = None, limit: int | None = None
) -> tuple[list[JobEvent], bool]:
    """The latest ``limit`` events (or those before seq ``before``), ascending, and
    whether earlier ones exist."""
    limit = int(limit or setting("TIMELINE_PAGE"))
    qs = JobEvent.objects.filter(job_id=job_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: limit + 1])
    earlier = len(rows) > limit
    return list(reversed(rows[:limit])), earlier


def events_after(job_id: uuid.UUID, after: int, limit: int = 500) -> list[JobEvent]:
    """Events with seq > ``after``, ascending: gap-free because seqs commit in order."""
    return list(JobEvent.objects.filter(job_id=job_id, seq__gt=after).order_by("seq")[:limit])
