"""Put jobs in each state through the public functions only, and read them back."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from jobs.claims import ClaimedJob, claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job
from jobs.operations import JobContext
from jobs.transitions import cancel_job, complete_job, emit_event, fail_job
from tests.integration.timelines import timeline_of


def unique_queue() -> str:
    """A queue of its own, so a claim in a test can only pick the job it means."""
    return f"q-{uuid.uuid4().hex[:12]}"


def queued(operation: str = "ping", payload: dict[str, Any] | None = None, **options: Any) -> Job:
    options.setdefault("queue", unique_queue())
    return enqueue(operation, payload or {}, **options)


def claim(
    job: Job, *, lease_seconds: float = 30.0, worker_id: uuid.UUID | None = None
) -> ClaimedJob:
    claimed = claim_jobs(
        queues=[job.queue],
        worker_id=worker_id or uuid.uuid4(),
        limit=1,
        lease_seconds=lease_seconds,
    )
    assert [c.id for c in claimed] == [job.pk], "the claim did not pick the job under test"
    return claimed[0]


def running(operation: str = "ping", **options: Any) -> tuple[Job, ClaimedJob]:
    lease_seconds = options.pop("lease_seconds", 30.0)
    job = queued(operation, **options)
    return job, claim(job, lease_seconds=lease_seconds)


def succeeded(**options: Any) -> Job:
    job, held = running(**options)
    complete_job(job.pk, lease_token=held.lease_token, result={"pong": True})
    return job


def failed(**options: Any) -> Job:
    job, held = running(**options)
    fail_job(job.pk, lease_token=held.lease_token, error_code="Boom", error_message="boom")
    return job


def cancelled(**options: Any) -> Job:
    job = queued(**options)
    assert cancel_job(job.pk) is True
    return job


def fresh(job_or_id: Job | uuid.UUID) -> Job:
    pk = job_or_id.pk if isinstance(job_or_id, Job) else job_or_id
    return Job.objects.get(pk=pk)


def timeline(job_or_id: Job | uuid.UUID) -> list[tuple[int, str]]:
    return timeline_of(job_or_id)


def assert_consistent(job_or_id: Job | uuid.UUID) -> list[tuple[int, str]]:
    """Seqs run 1..N with no gaps, and the job row's bookkeeping agrees with them."""
    events = timeline(job_or_id)
    job = fresh(job_or_id)
    assert [seq for seq, _ in events] == list(range(1, len(events) + 1)), events
    assert job.last_event_seq == len(events), (job.last_event_seq, events)
    return events


def snapshot(job_or_id: Job | uuid.UUID) -> tuple[Any, ...]:
    """What must not change when a transition is refused."""
    job = fresh(job_or_id)
    return (
        job.status,
        job.attempts,
        job.lease_token,
        job.leased_until,
        job.run_after,
        job.finished_at,
        job.error_code,
        job.result,
        job.last_event_seq,
        tuple(timeline(job)),
    )


def context(held: ClaimedJob) -> JobContext:
    """What a worker hands an operation: ``emit`` fenced by the job's lease token."""

    def emitter(**kwargs: Any) -> int:
        return emit_event(held.id, lease_token=held.lease_token, **kwargs)

    return JobContext(held, emitter=emitter)


def refused(job: Job, call: Any, error_type: type[BaseException]) -> BaseException:
    """``call()`` must raise ``error_type`` and leave the job exactly as it was."""
    before = snapshot(job)
    with pytest.raises(error_type) as info:
        call()
    assert snapshot(job) == before
    return info.value
