"""A remote worker's life: register, heartbeat, disconnect; and the orphan sweep.

A remote worker is a ``Worker`` row of kind ``remote`` owned by the user whose
token registered it. It serves only the queues and operations it named.
Operations only remote workers provide are declared at registration and kept
as ``RemoteOperation`` rows, which enqueue validates against. Once no worker
has provided one for ``REMOTE_OPERATION_GRACE_SECONDS`` (``jobs.remote_operations``)
and no job of it is pending, it is hidden (soft-deleted) until some worker
declares it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from django_controlplane.remote.errors import (
    LeaseNotYours,
    LocalOperationRefused,
    NotGranted,
    OperationOwned,
    RemoteRequestError,
    WorkerNotFound,
)
from django_controlplane.remote.grants import grant_for, may_serve_local
from jobs import audit
from jobs.clock import db_now
from jobs.conf import knob
from jobs.exceptions import IllegalTransition, LeaseLost
from jobs.models import Job, RemoteOperation, Worker, WorkerKind
from jobs.operations import registry, schema_problem
from jobs.remote_operations import mark_seen, soft_delete_orphan_operations
from jobs.states import CANCELLED, RUNNING
from jobs.storable import text_problem
from jobs.transitions import requeue_job
from jobs.wakeups import notify_queues

MAX_ATTEMPTS_LIMIT = 1000
MAX_CONCURRENCY = 1000
# Operations one registration may name: each declared schema is checked
# against the metaschema and stored, so a body of thousands would cost seconds.
MAX_OPERATIONS = 1000
NOT_REGISTERED = "The worker was not registered: fix the fields named in 'errors'."


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
    worker: Worker  # as of this heartbeat (``last_heartbeat`` included)
    # Held jobs this heartbeat found past their timeout and failed (``JobTimeout``); in ``lost``.
    timed_out: list[uuid.UUID]


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
    if len(entries) > MAX_OPERATIONS:
        raise RemoteRequestError(
            NOT_REGISTERED,
            {"operations": [f"A worker may name at most {MAX_OPERATIONS} operations."]},
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
        raise RemoteRequestError(NOT_REGISTERED, errors)
    return out


def _name_problem(value: Any, what: str) -> str | None:
    """Why ``value`` cannot be an operation or queue name, as a sentence; or None."""
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        return f"The {what} must be a non-empty string of at most 200 characters."
    reason = text_problem(value)
    return f"The {what} {reason}." if reason else None


def _check_entry(entry: dict[str, Any], declared: bool) -> dict[str, list[str]]:
    """Field errors of one declaration. Text is checked before any query uses it."""
    errors: dict[str, list[str]] = {}
    name = entry.get("name")
    if problem := _name_problem(name, "operation name"):
        return {"name": [problem]}
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
    if queue is not None and (problem := _name_problem(queue, "queue")):
        errors["queue"] = [problem]
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
    if schema is not None and (problem := schema_problem(schema)):
        errors["payload_schema"] = [problem]
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


def _refuse_local(entries: Sequence[Any]) -> None:
    """``LocalOperationRefused`` (403) for local operations, unless ``REMOTE_MAY_SERVE_LOCAL``."""
    if may_serve_local() or not isinstance(entries, (list, tuple)):
        return
    refused = []
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else entry
        if isinstance(name, str) and name in registry:
            refused.append((index, name))
    if refused:
        raise LocalOperationRefused(refused)


def _refuse_foreign(
    declarations: Sequence[Declaration], rows: dict[str, RemoteOperation], user: Any
) -> None:
    """``OperationOwned`` (409) for operations another account owns, declared or only named.

    Identical declarations are refused too: serving an operation is what lets
    an account claim its jobs and report their results. A superuser may
    declare or serve any operation (the owner stays).
    """
    if getattr(user, "is_superuser", False):
        return
    owned = [
        (index, d.name, row.owner.get_username())
        for index, d in enumerate(declarations)
        if (row := rows.get(d.name)) is not None
        and row.owner is not None
        and row.owner_id != user.pk
    ]
    if owned:
        raise OperationOwned(owned)


def _refuse_ungranted(
    declarations: Sequence[Declaration], queues: Sequence[str] | None, user: Any
) -> None:
    """``NotGranted`` (403) when ``REMOTE_WORKER_GRANTS`` is set and does not allow the
    account every operation named, every queue declared, and every queue served.

    The queues served are ``queues`` when given, else each operation's queue (as
    ``register_worker`` computes them). Superusers are not exempt (``grants``).
    """
    grant = grant_for(user)
    if grant is None:
        return
    username = user.get_username() if hasattr(user, "get_username") else str(user)
    if grant.empty:
        raise NotGranted(username, listed=False)
    operations: list[tuple[str, str]] = []
    refused_queues: list[tuple[str, str]] = []
    for index, d in enumerate(declarations):
        if not grant.allows_operation(d.name):
            operations.append((f"operations.{index}.name", d.name))
        if d.declared and not grant.allows_queue(declared := d.queue or "default"):
            refused_queues.append((f"operations.{index}.queue", declared))
        elif not queues and not d.declared and not grant.allows_queue(q := _queue_of(d)):
            refused_queues.append((f"operations.{index}.name", q))
    for index, queue in enumerate(queues or []):
        if not grant.allows_queue(queue):
            refused_queues.append((f"queues.{index}", queue))
    if operations or refused_queues:
        raise NotGranted(username, listed=True, operations=operations, queues=refused_queues)


def _definition(row: RemoteOperation) -> dict[str, Any]:
    return {
        "queue": row.queue,
        "payload_schema": row.payload_schema,
        "max_attempts": row.max_attempts,
    }


def _declare(
    d: Declaration, row: RemoteOperation | None, *, user: Any, now: datetime
) -> RemoteOperation:
    """Create or update the declared operation; the first account to declare it owns it.

    A new definition (queue, schema, attempts) or a new owner writes an audit row.
    """
    definition = {
        "queue": d.queue or "default",
        "payload_schema": d.payload_schema or {"type": "object"},
        "max_attempts": d.max_attempts or 1,
    }
    owner = user if getattr(user, "is_authenticated", False) else None
    if row is None:
        row = RemoteOperation.objects.create(
            name=d.name, deleted=False, updated_at=now, owner=owner, **definition
        )
        audit.record_action(
            user,
            audit.DECLARE_OPERATION,
            target=d.name,
            filters={**definition, "owner": owner.get_username() if owner else None},
        )
        return row
    before = _definition(row)
    claims = row.owner_id is None and owner is not None
    row.deleted, row.updated_at = False, now
    for field, value in definition.items():
        setattr(row, field, value)
    if claims:
        row.owner = owner
    row.save(update_fields=["deleted", "updated_at", "owner", *definition])
    if before != definition or claims:
        audit.record_action(
            user,
            audit.REDECLARE_OPERATION,
            target=d.name,
            filters={
                **definition,
                "previous": before,
                "owner": row.owner.get_username() if row.owner else None,
            },
        )
    return row


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
    _refuse_local(operations)
    declarations = parse_declarations(operations)
    if queues is not None:
        if not isinstance(queues, (list, tuple)):
            raise RemoteRequestError(
                NOT_REGISTERED, {"queues": ["Give a list of non-empty queue names."]}
            )
        errors = {
            f"queues.{index}": [problem]
            for index, queue in enumerate(queues)
            if (problem := _name_problem(queue, "queue name"))
        }
        if errors:
            raise RemoteRequestError(NOT_REGISTERED, errors)
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise RemoteRequestError(
            NOT_REGISTERED,
            {"concurrency": [f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}."]},
        )
    texts = {"name": name or "", "hostname": hostname or ""}
    errors = {
        field: [f"The {field} {reason}."]
        for field, value in texts.items()
        if isinstance(value, str) and (reason := text_problem(value))
    }
    if pid is not None and (
        isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < 2**31
    ):
        errors["pid"] = ["pid must be a whole number from 0 to 2147483647."]
    if errors:
        raise RemoteRequestError(NOT_REGISTERED, errors)
    now = db_now()  # the database's clock, as every heartbeat and sweep reads it
    with transaction.atomic():
        names = [d.name for d in declarations]
        rows = {
            row.name: row
            for row in RemoteOperation.objects.select_for_update(of=("self",))
            .filter(name__in=names)
            .select_related("owner")
        }
        _refuse_ungranted(declarations, queues, user)
        _refuse_foreign(declarations, rows, user)
        for d in declarations:
            if d.declared:
                _declare(d, rows.get(d.name), user=user, now=now)
            elif d.name not in registry:
                RemoteOperation.objects.filter(name=d.name, deleted=True).update(
                    deleted=False, updated_at=now
                )
        mark_seen([n for n in names if n not in registry], now)
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
    reaped, requeued, cancelled or timed out; ``cancelled`` is the subset an
    operator cancelled, ``timed_out`` the held jobs this heartbeat found past
    their ``timeout_seconds`` and failed with ``JobTimeout``), so a client
    never keeps working on a job it no longer holds.
    A held job another account's worker claimed is ``LeaseNotYours`` (403):
    nothing is extended, not even this worker's heartbeat.
    """
    from jobs.claims import extend_leases
    from jobs.timeouts import fail_overdue_jobs

    worker = get_remote_worker(worker_id, user=user)
    pairs = list(held) if held is not None else held_jobs(worker.pk)
    foreign = held_by_other_accounts(pairs, user=user)
    if foreign:
        raise LeaseNotYours(foreign)
    # A held job past its deadline is failed first (``job.timeout``), so it is lost below.
    timed_out = fail_overdue_jobs(held=pairs, by="heartbeat") if pairs else []
    lost = extend_leases(
        worker_id=worker.pk, held=pairs, lease_seconds=float(knob("LEASE_SECONDS"))
    )
    cancelled = (
        set(Job.objects.filter(pk__in=lost, status=CANCELLED).values_list("pk", flat=True))
        if lost
        else set()
    )
    kept = [job_id for job_id, _ in pairs if job_id not in lost]
    worker.last_heartbeat = db_now()  # about what extend_leases just wrote (the database's clock)
    return HeartbeatResult(
        held=kept,
        lost=sorted(lost, key=str),
        cancelled=sorted(cancelled, key=str),
        worker=worker,
        timed_out=sorted(timed_out, key=str),
    )


def held_by_other_accounts(
    pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], *, user: Any
) -> list[uuid.UUID]:
    """The jobs among ``(job id, lease token)`` pairs that a token holds for another account.

    A job is bound to the worker that claimed it (``Job.worker``, set with the
    token by the claim and cleared with it); the caller may use the token only
    if it registered that worker. Any of its workers will do, so a successor
    process of the same account can finish what its predecessor deferred. A
    pair whose token is stale is not named here: the write it guards is
    fenced and answers 409 as before.

    Race-free with the write that follows: token and worker change together
    (a new claim, a requeue), so a token still current at the write names the
    same worker as here.
    """
    if not pairs:
        return []
    wanted = {(job_id, token) for job_id, token in pairs}
    own = Worker.objects.filter(kind=WorkerKind.REMOTE, user_id=user.pk).values("pk")
    rows = (
        Job.objects.filter(
            pk__in={job_id for job_id, _ in wanted},
            status=RUNNING,
            lease_token__in={token for _, token in wanted},
        )
        .exclude(worker_id__in=own)
        .values_list("pk", "lease_token")
    )
    return sorted((pk for pk, token in rows if (pk, token) in wanted), key=str)


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
    # Its operations' grace (REMOTE_OPERATION_GRACE_SECONDS) counts from this goodbye.
    mark_seen(worker.operations or [], db_now())
    Worker.objects.filter(pk=worker.pk).delete()
    soft_delete_orphan_operations()
    notify_queues(sorted(queues))
    return requeued
