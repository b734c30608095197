"""A job's timeline as tests read it: through the product's own reader, so the implied
``job.enqueued`` (``jobs.timeline``) counts like a stored event."""

from __future__ import annotations

import uuid
from typing import Any

from jobs.selectors import MAX_EVENT_LIMIT, job_events_after


def timeline_of(job_or_id: Any) -> list[tuple[int, str]]:
    """(seq, event name) of every event of the job, ascending."""
    pk = getattr(job_or_id, "pk", job_or_id)
    out: list[tuple[int, str]] = []
    while True:
        page = job_events_after(uuid.UUID(str(pk)), out[-1][0] if out else 0, MAX_EVENT_LIMIT)
        out += [(e.seq, e.event) for e in page]
        if len(page) < MAX_EVENT_LIMIT:
            return out


def events_of(job_or_id: Any) -> list[str]:
    """Event names of the job, ascending."""
    return [name for _, name in timeline_of(job_or_id)]
