"""Jobs in every state, workers and users for tests, through the public functions only.

One signature per state: the operation first, then the payload, then
``enqueue``'s options (``queue``, ``parent``, ``max_attempts``, …). Each job
gets a queue of its own unless the test names one, so a claim picks only the
job it means.

``dash.echo`` accepts any JSON object (the diagnostic operations refuse extra
keys), so payload filters and hostile payloads can be exercised. It is
registered in the test process only: no worker process runs it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

from jobs.claims import ClaimedJob, claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, Worker
from jobs.operations import JobContext, operation, registry
from jobs.transitions import cancel_job, complete_job, emit_event, fail_job
from tests.integration.timelines import timeline_of

ECHO = "dash.echo"
HOSTILE_SCRIPT = "<script>window.__pwned=1</script>"
HOSTILE_IMG = '<img src=x onerror="window.__pwned=2">'
PASSWORD = "correct horse battery staple"

if ECHO not in registry:

    @operation(ECHO)
    def echo(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
        """Returns its payload."""
        return payload


# --- jobs ---------------------------------------------------------------------------


def unique_queue(prefix: str = "q") -> str:
    """A queue of its own, so a claim in a test can only pick the job it means."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def queued(operation: str = "ping", payload: dict[str, Any] | None = None, **options: Any) -> Job:
    options.setdefault("queue", unique_queue())
    return enqueue(operation, payload or {}, **options)


def worker(*, stale: bool = False, queues: list[str] | None = None, **fields: Any) -> Worker:
    """A registered worker; ``stale`` ones last beat an hour ago."""
    beat = timezone.now() - timedelta(hours=1) if stale else timezone.now()
    return Worker.objects.create(
        hostname=fields.pop("hostname", "worker-a.example"),
        pid=fields.pop("pid", 4242),
        queues=queues or ["default"],
        concurrency=fields.pop("concurrency", 4),
        last_heartbeat=beat,
        **fields,
    )


def claim(
    job: Job, *, lease_seconds: float = 30.0, worker_id: uuid.UUID | None = None
) -> ClaimedJob:
    """Claim ``job`` for ``worker_id`` (by default a fresh registered worker of its queue)."""
    if worker_id is None:
        worker_id = worker(queues=[job.queue]).pk
    claimed = claim_jobs(
        queues=[job.queue], worker_id=worker_id, limit=1, lease_seconds=lease_seconds
    )
    assert [c.id for c in claimed] == [job.pk], "the claim did not pick the job under test"
    return claimed[0]


def running(
    operation: str = "ping",
    payload: dict[str, Any] | None = None,
    *,
    lease_seconds: float = 30.0,
    worker_id: uuid.UUID | None = None,
    **options: Any,
) -> tuple[Job, ClaimedJob]:
    """A claimed job and its claim. Priority 100 unless told: claimed before the other
    queued jobs of a queue the test shares."""
    options.setdefault("priority", 100)
    job = queued(operation, payload, **options)
    return job, claim(job, lease_seconds=lease_seconds, worker_id=worker_id)


def succeeded(
    operation: str = "ping",
    payload: dict[str, Any] | None = None,
    *,
    result: Any = None,
    **options: Any,
) -> Job:
    job, held = running(operation, payload, **options)
    outcome = {"pong": True} if result is None else result
    complete_job(job.pk, lease_token=held.lease_token, result=outcome)
    return job


def failed(
    operation: str = "ping",
    payload: dict[str, Any] | None = None,
    *,
    code: str = "Boom",
    message: str = "boom",
    **options: Any,
) -> Job:
    job, held = running(operation, payload, **options)
    fail_job(job.pk, lease_token=held.lease_token, error_code=code, error_message=message)
    return job


def cancelled(
    operation: str = "ping", payload: dict[str, Any] | None = None, **options: Any
) -> Job:
    job = queued(operation, payload, **options)
    assert cancel_job(job.pk) is True
    return job


def tick(job: Job, held: ClaimedJob, current: int, total: int, message: str = "") -> int:
    """A progress event of a running job; returns its seq."""
    return emit_event(
        job.pk,
        event="sleep.tick",
        message=message,
        fields={"_progress_current": current, "_progress_total": total},
        lease_token=held.lease_token,
    )


def context(held: ClaimedJob) -> JobContext:
    """What a worker hands an operation: ``emit`` fenced by the job's lease token."""

    def emitter(**kwargs: Any) -> int:
        return emit_event(held.id, lease_token=held.lease_token, **kwargs)

    return JobContext(held, emitter=emitter)


# --- reading jobs back --------------------------------------------------------------


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


def refused(job: Job, call: Any, error_type: type[BaseException]) -> BaseException:
    """``call()`` must raise ``error_type`` and leave the job exactly as it was."""
    before = snapshot(job)
    with pytest.raises(error_type) as info:
        call()
    assert snapshot(job) == before
    return info.value


# --- users --------------------------------------------------------------------------


def make_user(role: str, username: str | None = None, *, password: bool = False) -> User:
    """``operator`` (change_job), ``viewer`` (view_job), ``admin`` (superuser) or ``nobody``.

    Without ``password`` the account has none (tests log in with
    ``force_login``), which skips the deliberately slow password hashing.
    """
    username = username or f"{role}-{uuid.uuid4().hex[:6]}"
    secret = PASSWORD if password else None
    if role == "admin":
        return User.objects.create_superuser(username, f"{username}@example.com", secret)
    user = User.objects.create_user(username, f"{username}@example.com", secret)
    codenames = {"operator": ["view_job", "change_job"], "viewer": ["view_job"]}.get(role, [])
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user
