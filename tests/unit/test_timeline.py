"""jobs.timeline.complete: where the implied ``job.enqueued`` goes, and where it must not."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from jobs.models import JobEvent
from jobs.timeline import complete

JOB = uuid.uuid4()
CREATED = datetime(2026, 11, 26, 3, 0, tzinfo=UTC)


def stored(*seqs: int) -> list[JobEvent]:
    return [JobEvent(job_id=JOB, seq=s, event=f"e{s}") for s in seqs]


def seqs(events: list[JobEvent]) -> list[int]:
    return [e.seq for e in events]


def test_the_first_page_starts_with_the_implied_enqueue():
    events = complete(stored(2, 3), job_id=JOB, created_at=CREATED)
    assert seqs(events) == [1, 2, 3]
    first = events[0]
    assert (first.event, first.level, first.message, first.fields) == (
        "job.enqueued",
        "info",
        "",
        {},
    )
    assert first.ts == CREATED and first.job_id == JOB and first.pk is None


def test_a_job_with_no_stored_event_has_its_enqueue():
    assert seqs(complete([], job_id=JOB, created_at=CREATED)) == [1]


def test_a_stored_seq_one_wins():
    events = complete(stored(1, 2), job_id=JOB, created_at=CREATED)
    assert seqs(events) == [1, 2] and events[0].event == "e1"


def test_a_page_after_the_first_seq_gets_nothing_added():
    assert seqs(complete(stored(2, 3), job_id=JOB, created_at=CREATED, after=1)) == [2, 3]
    assert complete([], job_id=JOB, created_at=CREATED, after=5) == []


def test_the_limit_counts_the_implied_event():
    assert seqs(complete(stored(2, 3, 4), job_id=JOB, created_at=CREATED, limit=3)) == [1, 2, 3]
