"""Putting jobs in every state for dashboard tests, through the public functions only.

``dash.echo`` accepts any JSON object (the diagnostic operations refuse extra
keys), so payload filters and hostile payloads can be exercised. It is
registered in the test process only: nothing runs it, the dashboard just
shows it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import Permission, User
from django.utils import timezone

from jobs.claims import ClaimedJob, claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, Worker
from jobs.operations import operation, registry
from jobs.transitions import cancel_job, complete_job, emit_event, fail_job

ECHO = "dash.echo"
HOSTILE_SCRIPT = "<script>window.__pwned=1</script>"
HOSTILE_IMG = '<img src=x onerror="window.__pwned=2">'

if ECHO not in registry:

    @operation(ECHO)
    def echo(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
        """Returns its payload."""
        return payload


PASSWORD = "correct horse battery staple"


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


def unique_queue(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def queued(payload: dict[str, Any] | None = None, **options: Any) -> Job:
    options.setdefault("queue", unique_queue())
    return enqueue(options.pop("operation", ECHO), payload or {}, **options)


def worker(*, stale: bool = False, queues: list[str] | None = None, **fields: Any) -> Worker:
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
    job: Job, *, worker_id: uuid.UUID | None = None, lease_seconds: float = 300
) -> ClaimedJob:
    if worker_id is None:
        worker_id = worker(queues=[job.queue]).pk
    claimed = claim_jobs(
        queues=[job.queue], worker_id=worker_id, limit=1, lease_seconds=lease_seconds
    )
    assert [c.id for c in claimed] == [job.pk], "the claim did not pick the job under test"
    return claimed[0]


def running(payload: dict[str, Any] | None = None, **options: Any) -> tuple[Job, ClaimedJob]:
    worker_id = options.pop("worker_id", None)
    options.setdefault("priority", 100)  # claimed before other queued jobs of a shared queue
    job = queued(payload, **options)
    return job, claim(job, worker_id=worker_id)


def tick(job: Job, held: ClaimedJob, current: int, total: int, message: str = "") -> int:
    return emit_event(
        job.pk,
        event="sleep.tick",
        message=message,
        fields={"_progress_current": current, "_progress_total": total},
        lease_token=held.lease_token,
    )


def failed(
    payload: dict[str, Any] | None = None,
    *,
    code: str = "ValueError",
    message: str = "boom",
    **options: Any,
) -> Job:
    job, held = running(payload, **options)
    fail_job(job.pk, lease_token=held.lease_token, error_code=code, error_message=message)
    return job


def succeeded(payload: dict[str, Any] | None = None, **options: Any) -> Job:
    job, held = running(payload, **options)
    complete_job(job.pk, lease_token=held.lease_token, result={"ok": True})
    return job


def cancelled(payload: dict[str, Any] | None = None, **options: Any) -> Job:
    job = queued(payload, **options)
    assert cancel_job(job.pk) is True
    return job


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)
