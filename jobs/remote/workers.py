"""A remote worker's life: register, heartbeat, disconnect; and the orphan sweep.

A remote worker is a ``Worker`` row of kind ``remote`` owned by the user whose
token registered it. It serves only the queues and operations it named.
Operations only remote workers provide are declared at registration and kept
as ``RemoteOperation`` rows, which enqueue validates against; once no worker
provides one and no job of it is pending, it is hidden (soft-deleted) until
some worker declares it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import jsonschema
from django.db import transaction
from django.utils import timezone

from jobs.conf import knob
from jobs.enqueue import notify_queues
from jobs.exceptions import IllegalTransition, LeaseLost
from jobs.models import Job, RemoteOperation, Worker, WorkerKind
from jobs.operations import registry
from jobs.remote.errors import RemoteRequestError, WorkerNotFound
from jobs.states import ACTIVE, CANCELLED, RUNNING
from jobs.transitions import requeue_job

MAX_ATTEMPTS_LIMIT = 1000
MAX_CONCURRENCY = 1000


@dataclass(frozen=True)
class Declaration:
    """One entry of ``operations`` at registration, normalised."""

    name: str
    queue: str | None = None
    payload_schema: dict[str, Any] | None = None
    max_attempts: int | None = None
    declared: bool = False  # an object with a definition, not a plain name


@dataclass(frozen=True)
class HeartbeatResult:
    held: list[uuid.UUID]
    lost: list[uuid.UUID]
    cancelled: list[uuid.UUID]


def get_remote_worker(worker_id: uuid.UUID | str, *, user: Any) -> Worker:
    """The caller's remote worker, or ``WorkerNotFound`` (never another user's)."""
    try:
        pk = uuid.UUID(str(worker_id))
    except ValueError:
        raise WorkerNotFound(worker_id) from None
    worker = Worker.objects.filter(pk=pk, kind=WorkerKind.REMOTE, user_id=user.pk).first()
    if worker is None:
        raise WorkerNotFound(worker_id)
    return worker


# --- register -----------------------------------------------------------------


def parse_declarations(entries: Sequence[Any]) -> list[Declaration]:
    """Normalise ``operations`` (plain names or objects) and check each one.

    Raises ``RemoteRequestError`` naming ``operations.<index>.<field>``.
    """
    errors: dict[str, list[str]] = {}
    out: list[Declaration] = []
    if not isinstance(entries, (list, tuple)) or not entries:
        raise RemoteRequestError(
            "A remote worker must name the operations it runs.",
            {"operations": ["Give a non-empty list of operation names or declarations."]},
        )
    for index, entry in enumerate(entries):
        where = f"operations.{index}"
        if isinstance(entry, str):
            entry = {"name": entry}
            declared = False
        elif isinstance(entry, dict):
            declared = any(k in entry for k in ("queue", "payload_schema", "max_attempts"))
        else:
            errors[where] = [
                "Each operation is a name or an object "
                "{name, queue?, payload_schema?, max_attempts?}."
            ]
            continue
        problems = _check_entry(entry, declared)
        for field, messages in problems.items():
            errors[f"{where}.{field}"] = messages
        if not problems:
            out.append(
                Declaration(
                    name=entry["name"],
                    queue=entry.get("queue"),
                    payload_schema=entry.get("payload_schema"),
                    max_attempts=entry.get("max_attempts"),
                    declared=declared,
                )
            )
    names = [d.name for d in out]
    if len(set(names)) != len(names):
        errors["operations"] = ["Each operation may be named only once."]
    if errors:
        raise RemoteRequestError(
            "The worker was not registered: fix the fields named in 'errors'.", errors
        )
    return out


def _check_entry(entry: dict[str, Any], declared: bool) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        return {
            "name": ["The operation name must be a non-empty string of at most 200 characters."]
        }
    if declared and name in registry:
        errors["name"] = [
            f"{name!r} is a built-in operation; list it by name, without a definition."
        ]
    if (
        not declared
        and name not in registry
        and not RemoteOperation.objects.filter(name=name).exists()
    ):
        errors["name"] = [
            f"Unknown operation {name!r}; declare it as an object "
            "with its queue and payload_schema."
        ]
    queue = entry.get("queue")
    if queue is not None and (not isinstance(queue, str) or not queue.strip() or len(queue) > 200):
        errors["queue"] = ["The queue must be a non-empty string of at most 200 characters."]
    attempts = entry.get("max_attempts")
    if attempts is not None and (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT
    ):
        errors["max_attempts"] = [
            f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT}."
        ]
    schema = entry.get("payload_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            errors["payload_schema"] = ["The payload schema must be a JSON Schema object."]
        else:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as error:
                errors["payload_schema"] = [
                    f"The payload schema is not valid JSON Schema: {error.message}"
                ]
    return errors


def _queue_of(declaration: Declaration) -> str:
    if declaration.name in registry:
        return registry.get(declaration.name).queue
    if declaration.queue:
        return declaration.queue
    row = (
        RemoteOperation.objects.filter(name=declaration.name)
        .values_list("queue", flat=True)
        .first()
    )
    return row or "default"


def register_worker(
    *,
    user: Any,
    name: str = "",
    operations: Sequence[Any],
    queues: Sequence[str] | None = None,
    concurrency: int = 1,
    hostname: str = "",
    pid: int | None = None,
) -> Worker:
    """Create the caller's remote worker and upsert (un-hide) the operations it declares.

    ``queues`` defaults to the queues of its operations. The upserts and the
    new row commit together, locked against a concurrent orphan sweep.
    """
    declarations = parse_declarations(operations)
    if queues is not None and (
        not isinstance(queues, (list, tuple))
        or not all(isinstance(q, str) and q.strip() and len(q) <= 200 for q in queues)
    ):
        raise RemoteRequestError(
            "The worker was not registered: fix the fields named in 'errors'.",
            {"queues": ["Give a list of non-empty queue names."]},
        )
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise RemoteRequestError(
            "The worker was not registered: fix the fields named in 'errors'.",
            {"concurrency": [f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}."]},
        )
    now = timezone.now()
    with transaction.atomic():
        names = [d.name for d in declarations]
        list(RemoteOperation.objects.select_for_update().filter(name__in=names).values_list("pk"))
        for d in declarations:
            if d.declared:
                defaults: dict[str, Any] = {"deleted": False, "updated_at": now}
                defaults["queue"] = d.queue or "default"
                defaults["payload_schema"] = d.payload_schema or {"type": "object"}
                defaults["max_attempts"] = d.max_attempts or 1
                RemoteOperation.objects.update_or_create(name=d.name, defaults=defaults)
            elif d.name not in registry:
                RemoteOperation.objects.filter(name=d.name, deleted=True).update(
                    deleted=False, updated_at=now
                )
        served = list(dict.fromkeys(queues or [_queue_of(d) for d in declarations]))
        return Worker.objects.create(
            name=(name or "")[:200],
            kind=WorkerKind.REMOTE,
            hostname=(hostname or "")[:255],
            pid=pid,
            queues=served,
            operations=names,
            concurrency=concurrency,
            started_at=now,
            last_heartbeat=now,
            user=user,
        )


# --- heartbeat ----------------------------------------------------------------


def held_jobs(worker_id: uuid.UUID) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(job id, lease token) of the jobs the worker holds a lease on, deferred ones included."""
    rows = Job.objects.filter(worker_id=worker_id, status=RUNNING, lease_token__isnull=False)
    return list(rows.values_list("id", "lease_token"))


def heartbeat(
    *,
    worker_id: uuid.UUID | str,
    user: Any,
    held: Sequence[tuple[uuid.UUID, uuid.UUID]] | None = None,
) -> HeartbeatResult:
    """Mark the worker alive and extend the leases of the jobs it holds.

    ``held`` is what the client believes it runs; without it, the server's
    view is used. The result names the jobs the worker must stop (``lost``:
    reaped, requeued or cancelled; ``cancelled`` is the subset an operator
    cancelled), so a client never keeps working on a job it no longer holds.
    """
    from jobs.claims import extend_leases

    worker = get_remote_worker(worker_id, user=user)
    pairs = list(held) if held is not None else held_jobs(worker.pk)
    lost = extend_leases(
        worker_id=worker.pk, held=pairs, lease_seconds=float(knob("LEASE_SECONDS"))
    )
    cancelled = (
        set(Job.objects.filter(pk__in=lost, status=CANCELLED).values_list("pk", flat=True))
        if lost
        else set()
    )
    kept = [job_id for job_id, _ in pairs if job_id not in lost]
    return HeartbeatResult(
        held=kept, lost=sorted(lost, key=str), cancelled=sorted(cancelled, key=str)
    )


# --- disconnect and the orphan sweep ---------------------------------------------


def disconnect_worker(*, worker_id: uuid.UUID | str, user: Any) -> list[uuid.UUID]:
    """Graceful goodbye: requeue what the worker holds (attempt not counted), remove it.

    Returns the requeued job ids. Jobs that changed hands meanwhile
    (cancelled, reaped) are left as they are.
    """
    worker = get_remote_worker(worker_id, user=user)
    requeued: list[uuid.UUID] = []
    queues: set[str] = set()
    for job_id, token in held_jobs(worker.pk):
        try:
            requeue_job(job_id, lease_token=token, reason="remote worker disconnected")
        except (LeaseLost, IllegalTransition):
            continue
        requeued.append(job_id)
    if requeued:
        queues = set(Job.objects.filter(pk__in=requeued).values_list("queue", flat=True))
    Worker.objects.filter(pk=worker.pk).delete()
    soft_delete_orphan_operations()
    notify_queues(sorted(queues))
    return requeued


def soft_delete_orphan_operations() -> int:
    """Hide remote operations no live worker provides and no pending job needs.

    Live means a heartbeat within ``WORKER_TIMEOUT_SECONDS``: a worker that
    stopped beating but was not swept yet provides nothing, so its
    operations are hidden at once (they come back when it registers again).

    Safe to call any time and from several processes at once: the candidate
    rows are locked, so a registration that declares one of them either
    commits first (and its worker is seen) or un-hides it after. Returns the
    number of operations hidden.
    """
    with transaction.atomic():
        candidates = set(
            RemoteOperation.objects.select_for_update()
            .filter(deleted=False)
            .values_list("name", flat=True)
        )
        if not candidates:
            return 0
        provided: set[str] = set()
        alive_since = timezone.now() - timedelta(seconds=float(knob("WORKER_TIMEOUT_SECONDS")))
        live = Worker.objects.filter(kind=WorkerKind.REMOTE, last_heartbeat__gte=alive_since)
        for ops in live.values_list("operations", flat=True):
            provided.update(ops or [])
        pending = set(
            Job.objects.filter(status__in=list(ACTIVE), operation__in=candidates)
            .values_list("operation", flat=True)
            .distinct()
        )
        orphans = candidates - provided - pending
        if not orphans:
            return 0
        return RemoteOperation.objects.filter(name__in=orphans, deleted=False).update(
            deleted=True, updated_at=timezone.now()
        )
