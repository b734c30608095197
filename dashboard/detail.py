"""Reads for one job's page: its facts, parent and children, progress and timeline.

The timeline is read by ``seq`` on the unique ``(job, seq)`` index, newest
page first; ``events_after`` is the cursor live updates and polling share.
A level filter narrows the same read to that job's rows, so a page stays
bounded; ``timeline_entries`` then folds runs of progress-only ticks into
one entry each (``live.js`` folds live arrivals the same way).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from dashboard.conf import setting
from dashboard.selectors import LIST_FIELDS, STATES
from jobs.events import JOB_FAILED, JOB_RETRY_SCHEDULED, JOB_STARTED, JOB_TIMEOUT
from jobs.models import EventLevel, Job, JobEvent, Worker
from jobs.selectors import job_events_after
from jobs.selectors.counts import CountResult, capped_count
from jobs.selectors.workers import stale_before
from jobs.states import RUNNING
from jobs.timeline import complete as complete_timeline


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


# Events whose fields carry a failure's traceback and fingerprint (``jobs.failures``;
# a worker's ``job.timeout`` keeps the stack of the run at its deadline).
FAILURE_EVENTS = (JOB_FAILED, JOB_RETRY_SCHEDULED, JOB_TIMEOUT)
# How far back from a job's last event its failure is looked for: a failure is
# its last event unless a later attempt runs, and the scan stays bounded then.
FAILURE_LOOKBACK = 1000


@dataclass(frozen=True)
class LastFailure:
    """The failure event behind the error a job shows: ``seq`` keys its traceback block."""

    seq: int
    traceback: str
    fingerprint: str


def last_failure(job: Job) -> LastFailure | None:
    """The latest failure event of ``job`` if it recorded the error the job shows now.

    An error written without one (a lease expiry, a timeout) after an earlier
    failure must not borrow that failure's traceback, hence the comparison.
    """
    if not (job.error_code or job.error_message):
        return None
    row = (
        JobEvent.objects.filter(
            job_id=job.pk,
            event__in=FAILURE_EVENTS,
            seq__gt=job.last_event_seq - FAILURE_LOOKBACK,
        )
        .order_by("-seq")
        .values_list("seq", "fields")
        .first()
    )
    if row is None or not isinstance(row[1], dict):
        return None
    seq, fields = row
    if (fields.get("error_code"), fields.get("error_message")) != (
        job.error_code,
        job.error_message,
    ):
        return None
    return LastFailure(
        seq=seq,
        traceback=str(fields.get("traceback") or ""),
        fingerprint=str(fields.get("fingerprint") or ""),
    )


@dataclass
class JobDetail:
    job: Job
    worker: Worker | None
    worker_stale: bool
    parent: Job | None
    children: list[Job]
    child_counts: dict[str, CountResult]
    progress: Progress | None
    failure: LastFailure | None = None
    # The host and pid of the latest run when its worker row is gone (``job.started``'s fields).
    last_runner: dict[str, Any] | None = None

    @property
    def child_total(self) -> int:
        return sum(int(c) for c in self.child_counts.values())

    @property
    def has_children(self) -> bool:
        return any(c.value for c in self.child_counts.values())


def job_detail(job_id: uuid.UUID | str) -> JobDetail | None:
    """Everything the job page shows except the timeline (see ``timeline``)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    worker = Worker.objects.filter(pk=job.worker_id).first() if job.worker_id else None
    last_runner = (
        JobEvent.objects.filter(job_id=job.pk, event=ATTEMPT_EVENT)
        .order_by("-seq")
        .values_list("fields", flat=True)
        .first()
        if job.worker_id and worker is None
        else None
    )
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
        failure=last_failure(job),
        last_runner=last_runner if isinstance(last_runner, dict) else None,
    )


# Levels from least to most severe: a filter at one level shows it and those after it.
LEVELS: tuple[str, ...] = tuple(EventLevel.values)
# Each claim writes this event: it begins an attempt, and heads it on the timeline.
ATTEMPT_EVENT = JOB_STARTED
PROGRESS_PREFIX = "_progress_"


def timeline_level(raw: str | None) -> str:
    """The level filter named by ``?level=``: ``""`` (everything) or a level above the least.

    The least severe level shows everything, so it is the same as no filter;
    anything unknown is ignored rather than refused (it comes from a link).
    """
    return raw if raw in LEVELS[1:] else ""


def timeline(
    job_id: uuid.UUID,
    *,
    before: int | None = None,
    limit: int | None = None,
    level: str = "",
) -> tuple[list[JobEvent], bool]:
    """The latest ``limit`` events (or those before seq ``before``), ascending, and
    whether earlier ones exist.

    With a ``level`` only events at that level or above are read, plus every
    attempt's start, which heads its group on the timeline.
    """
    limit = int(limit or setting("TIMELINE_PAGE"))
    qs = JobEvent.objects.filter(job_id=job_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    if level in LEVELS:
        qs = qs.filter(Q(level__in=LEVELS[LEVELS.index(level) :]) | Q(event=ATTEMPT_EVENT))
    rows = list(reversed(qs.order_by("-seq")[: limit + 1]))
    reaches_start = len(rows) <= limit and (before is None or before > 1)
    if reaches_start and level in ("", LEVELS[0]):
        created_at = Job.objects.filter(pk=job_id).values_list("created_at", flat=True).first()
        if created_at is not None:
            rows = complete_timeline(rows, job_id=job_id, created_at=created_at)
    earlier = len(rows) > limit
    return rows[-limit:], earlier


def events_after(job_id: uuid.UUID, after: int, limit: int = 500) -> list[JobEvent]:
    """Events with seq > ``after``, ascending: gap-free because seqs commit in order."""
    return job_events_after(job_id, after, limit)


def is_progress_only(event: JobEvent) -> bool:
    """True for a tick that carries nothing but ``_progress_*`` fields (the bar shows them)."""
    fields = event.fields
    return (
        isinstance(fields, dict)
        and bool(fields)
        and all(str(key).startswith(PROGRESS_PREFIX) for key in fields)
    )


@dataclass(frozen=True)
class TimelineEntry:
    """One line of the timeline: an event, or the latest of a run of ``count``
    progress-only ticks of the same name and message, the first being ``first_seq``."""

    event: JobEvent
    count: int = 1
    first_seq: int = 0

    @property
    def folded(self) -> bool:
        return self.count > 1


def timeline_entries(events: Sequence[JobEvent]) -> list[TimelineEntry]:
    """``events`` (ascending) as lines, consecutive progress-only ticks folded into one.

    Only ticks that say nothing new fold: same event name, same message (often
    empty). Anything else between two ticks ends the run.
    """
    entries: list[TimelineEntry] = []
    for event in events:
        last = entries[-1] if entries else None
        if (
            last is not None
            and is_progress_only(event)
            and is_progress_only(last.event)
            and (event.event, event.message) == (last.event.event, last.event.message)
        ):
            entries[-1] = TimelineEntry(event, last.count + 1, last.first_seq)
        else:
            entries.append(TimelineEntry(event, 1, event.seq))
    return entries


def progress_value(fields: Any) -> str:
    """A tick's progress as ``3 / 10`` (or ``3``), ``""`` when it reports none."""
    if not isinstance(fields, dict) or f"{PROGRESS_PREFIX}current" not in fields:
        return ""
    current, total = fields.get(f"{PROGRESS_PREFIX}current"), fields.get(f"{PROGRESS_PREFIX}total")
    text = f"{current} / {total}" if total is not None else str(current)
    return text if len(text) <= 60 else text[:59] + "…"  # a local emit may pass anything
