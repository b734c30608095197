"""A job's timeline: its stored events, with the ``job.enqueued`` event implied by the job row.

Enqueue writes one row, the job. Its timeline's first event (seq 1,
``job.enqueued``, level info, no message, no fields, at ``Job.created_at``)
says nothing the job row does not, so it is not stored: the job row is
inserted with ``last_event_seq = 1`` and every later event takes seq 2, 3 …
under the job's row lock as before. Every reader of a timeline goes through
``complete`` and sees seq 1 as if it were stored, so the numbering and the
``after=`` cursor stay gap-free. Writing one row instead of two takes about
40 % of the server's work off a bulk enqueue (``bench/README.md``).

A stored seq 1 wins over the implied one: jobs enqueued before this change
have theirs, and a schedule's job stores its own to name the schedule and
the slot (``jobs.schedules.firing``).

Readers of the event table as a stream (the dashboard relay, the metrics
rollup) do not see implied events; the relay learns of new jobs from the job
table instead (``dashboard.cursor.NewJobCursor``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from jobs.events import JOB_ENQUEUED
from jobs.models import EventLevel, JobEvent


def enqueued_event(job_id: uuid.UUID, created_at: datetime) -> JobEvent:
    """The implied first event of the job (unsaved: ``id`` is None)."""
    return JobEvent(
        job_id=job_id,
        seq=1,
        ts=created_at,
        event=JOB_ENQUEUED,
        level=EventLevel.INFO,
        message="",
        fields={},
    )


def complete(
    stored: Sequence[JobEvent],
    *,
    job_id: uuid.UUID,
    created_at: datetime,
    after: int = 0,
    limit: int | None = None,
) -> list[JobEvent]:
    """``stored`` (ascending, all with ``seq > after``) with the implied seq 1 put first
    when the page starts there and no stored seq 1 is present; at most ``limit`` events."""
    events = list(stored)
    if after < 1 and not (events and events[0].seq == 1):
        events.insert(0, enqueued_event(job_id, created_at))
    return events if limit is None else events[:limit]
