"""Putting jobs on queues, from Python, the CLI and the REST API alike.

``enqueue_many`` stores any number of jobs and their ``job.enqueued`` events
in one statement per 1,000 jobs, inside the caller's transaction if there is
one: the jobs exist only if the caller commits. On PostgreSQL the same
statement sends one ``NOTIFY`` per queue (only the queue name: workers treat
it as a hint and claim from the table).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from jobs.conf import knob
from jobs.dialect import dialect
from jobs.exceptions import EnqueueError
from jobs.models import PRIORITY_MAX, PRIORITY_MIN, Job
from jobs.operations import operation_spec

NOTIFY_CHANNEL = "controlplane_jobs"
CHUNK = 1000

JOB_COLUMNS = (
    "id, operation, queue, payload, status, priority, run_after, expires_at, attempts, "
    "max_attempts, lease_requeues, parent_id, progress_current, progress_total, error_code, "
    "error_message, created_at, idempotency_key, last_event_seq, last_event_at"
)


@dataclass
class JobSpec:
    """One job to enqueue; ``None`` fields take the operation's defaults."""

    operation: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    run_after: datetime | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    parent: uuid.UUID | str | None = None
    idempotency_key: str | None = None


@dataclass(slots=True)
class _Row:
    """A validated spec, ready to insert: the payload is serialised once."""

    id: uuid.UUID
    operation: str
    queue: str
    payload: Any
    payload_json: str
    priority: int
    run_after: datetime
    expires_at: datetime | None
    max_attempts: int
    parent_id: uuid.UUID | None
    idempotency_key: str | None


def _prepare(
    spec: JobSpec, op: Any, limit: int, now: datetime
) -> tuple[_Row | None, dict[str, list[str]]]:
    if isinstance(op, EnqueueError):
        return None, dict(op.errors)
    if not isinstance(spec.payload, dict):
        return None, {"payload": ["The payload must be a JSON object."]}
    errors: dict[str, list[str]] = {}
    try:
        payload_json = json.dumps(spec.payload, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        return None, {"payload": [f"The payload is not JSON: {error}"]}
    size = len(payload_json.encode())
    if size > limit:
        errors["payload"] = [f"The payload is {size} bytes; the limit is {limit} bytes."]
    else:
        errors.update(op.validate(spec.payload))
    priority = spec.priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
        PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        errors["priority"] = [
            f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        ]
    max_attempts = spec.max_attempts
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 1000
    ):
        errors["max_attempts"] = ["max_attempts must be a whole number from 1 to 1000."]
    for name in ("run_after", "expires_at"):
        value = getattr(spec, name)
        if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
            errors[name] = [f"{name} must be a timezone-aware datetime."]
    if spec.queue is not None and (not isinstance(spec.queue, str) or not spec.queue.strip()):
        errors["queue"] = ["The queue name must be a non-empty string."]
    key = spec.idempotency_key
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
        errors["idempotency_key"] = ["The idempotency key must be 1 to 255 characters."]
    parent_id = None
    if spec.parent:
        try:
            parent_id = spec.parent if isinstance(spec.parent, uuid.UUID) else uuid.UUID(str(spec.parent))
        except ValueError:
            errors["parent"] = [f"No job with id {spec.parent}."]
    if errors:
        return None, errors
    row = _Row(
        id=uuid.uuid4(),
        operation=spec.operation,
        queue=spec.queue or op.queue,
        payload=spec.payload,
        payload_json=payload_json,
        priority=priority,
        run_after=spec.run_after or now,
        expires_at=spec.expires_at,
        max_attempts=max_attempts or op.max_attempts,
        parent_id=parent_id,
        idempotency_key=key,
    )
    return row, {}


def _resolve(name: str) -> Any:
    try:
        return operation_spec(name)
    except EnqueueError as error:
        return error


def enqueue_many(specs: Sequence[JobSpec], *, using: str = "default") -> list[Job]:
    """Validate and store ``specs``; return their jobs in the same order.

    Nothing is stored if any spec is invalid (``EnqueueError`` names the
    index and field). A spec whose ``idempotency_key`` already exists returns
    the existing job instead of a new one.
    """
    now = timezone.now()
    limit = int(knob("MAX_PAYLOAD_BYTES"))
    ops: dict[str, Any] = {}
    rows: list[_Row] = []
    errors: dict[str, list[str]] = {}
    for index, spec in enumerate(specs):
        if spec.operation not in ops:
            ops[spec.operation] = _resolve(spec.operation)
        row, field_errors = _prepare(spec, ops[spec.operation], limit, now)
        if row is not None:
            rows.append(row)
        for name, messages in field_errors.items():
            errors[name if len(specs) == 1 else f"{index}.{name}"] = messages
    if errors:
        if all(name.endswith("parent") for name in errors):
            raise EnqueueError("The job was not enqueued: its parent does not exist.", errors)
        raise EnqueueError("The job was not enqueued: fix the fields named in 'errors'.", errors)
    parents = {r.parent_id for r in rows if r.parent_id}
    if parents:
        found = set(Job.objects.using(using).filter(pk__in=parents).values_list("pk", flat=True))
        missing = parents - found
        if missing:
            raise EnqueueError(
                "The job was not enqueued: its parent does not exist.",
                {"parent": [f"No job with id {m}." for m in sorted(map(str, missing))]},
            )
    inserted: set[uuid.UUID] = set()
    chunks = [rows[start : start + CHUNK] for start in range(0, len(rows), CHUNK)]
    if len(chunks) == 1:  # one statement is atomic on its own: no BEGIN/COMMIT round trips
        inserted = _insert(chunks[0], now, using=using)
    else:
        with transaction.atomic(using=using):
            for chunk in chunks:
                inserted |= _insert(chunk, now, using=using)
    keyed = {r.idempotency_key for r in rows if r.id not in inserted and r.idempotency_key}
    existing = (
        {j.idempotency_key: j for j in Job.objects.using(using).filter(idempotency_key__in=keyed)}
        if keyed
        else {}
    )
    return [
        _job(r, now, using) if r.id in inserted else existing[r.idempotency_key] for r in rows
    ]


def enqueue(operation: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
    """Enqueue one job. Options are the fields of ``JobSpec``."""
    using = options.pop("using", "default")
    spec = JobSpec(operation=operation, payload=payload if payload is not None else {}, **options)
    return enqueue_many([spec], using=using)[0]


def _job(row: _Row, now: datetime, using: str) -> Job:
    """The stored job as a model instance, built without Model.__init__'s per-field work.

    Bulk enqueue returns thousands of these; the full constructor alone would
    cost more than the INSERT.
    """
    values = {
        "id": row.id, "operation": row.operation, "queue": row.queue, "payload": row.payload,
        "status": "queued", "priority": row.priority, "run_after": row.run_after,
        "expires_at": row.expires_at, "attempts": 0, "max_attempts": row.max_attempts,
        "lease_requeues": 0, "parent_id": row.parent_id, "progress_current": 0,
        "progress_total": None, "leased_until": None, "lease_token": None, "worker_id": None,
        "result": None, "error_code": "", "error_message": "", "created_at": now,
        "started_at": None, "finished_at": None, "idempotency_key": row.idempotency_key,
        "last_event_seq": 1, "last_event_at": now,
    }
    job = Job.__new__(Job)
    job.__dict__.update(values)
    job._state = ModelState()
    job._state.adding = False
    job._state.db = using
    return job


INSERT_CONFLICT = "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
EVENT_COLUMNS = "job_id, seq, ts, event, level, message, fields"


def _insert(rows: list[_Row], now: datetime, *, using: str) -> set[uuid.UUID]:
    """Insert jobs and their ``job.enqueued`` events; return the ids actually inserted."""
    d = dialect(using)
    with connections[using].cursor() as cursor:
        if d.postgres:
            # One JSON document for the whole batch: the statement text never
            # changes and the payloads travel as they are, not re-encoded per column.
            cursor.execute(
                f"WITH ins AS (INSERT INTO jobs_job ({JOB_COLUMNS}) "
                "SELECT u.id, u.operation, u.queue, u.payload, 'queued', u.priority, u.run_after, "
                "u.expires_at, 0, u.max_attempts, 0, u.parent, 0, NULL, '', '', %s, u.ikey, 1, %s "
                "FROM jsonb_to_recordset(%s::jsonb) AS u(id uuid, operation text, queue text, "
                "payload jsonb, priority int, run_after timestamptz, expires_at timestamptz, "
                f"max_attempts int, parent uuid, ikey text) {INSERT_CONFLICT} RETURNING id) "
                f"INSERT INTO jobs_jobevent ({EVENT_COLUMNS}) "
                "SELECT ins.id, 1, %s, 'job.enqueued', 'info', '', '{}'::jsonb FROM ins "
                # One NOTIFY per queue, delivered at commit; a hint, never the job.
                f"CROSS JOIN (SELECT count(pg_notify('{NOTIFY_CHANNEL}', q)) FROM "
                "unnest(%s::text[]) AS q) AS notified "
                "RETURNING job_id",
                [now, now, _rows_document(rows), now, sorted({r.queue for r in rows})],
            )
            return {r[0] for r in cursor.fetchall()}
        values = "(%s, %s, %s, %s, 'queued', %s, %s, %s, 0, %s, 0, %s, 0, NULL, '', '', %s, %s, 1, %s)"
        params: list[Any] = []
        created = d.ts(now)
        for r in rows:
            params += [
                d.uuid(r.id), r.operation, r.queue, r.payload_json, r.priority, d.ts(r.run_after),
                d.ts(r.expires_at), r.max_attempts, d.uuid(r.parent_id), created,
                r.idempotency_key, created,
            ]
        cursor.execute(
            f"INSERT INTO jobs_job ({JOB_COLUMNS}) VALUES {', '.join([values] * len(rows))} "
            f"{INSERT_CONFLICT} RETURNING id",
            params,
        )
        ids = [r[0] for r in cursor.fetchall()]
        cursor.executemany(
            f"INSERT INTO jobs_jobevent ({EVENT_COLUMNS}) "
            "VALUES (%s, 1, %s, 'job.enqueued', 'info', '', '{}')",
            [(job_id, created) for job_id in ids],
        )
        return {d.read_uuid(job_id) for job_id in ids}


def _rows_document(rows: list[_Row]) -> str:
    """The batch as a JSON array, with each payload's JSON spliced in as it was serialised."""
    dumps = json.dumps
    parts = [
        f'{{"id":"{r.id}","operation":{dumps(r.operation)},"queue":{dumps(r.queue)},'
        f'"payload":{r.payload_json},"priority":{r.priority},'
        f'"run_after":"{r.run_after.isoformat()}",'
        f'"expires_at":{dumps(r.expires_at.isoformat()) if r.expires_at else "null"},'
        f'"max_attempts":{r.max_attempts},'
        f'"parent":{dumps(str(r.parent_id)) if r.parent_id else "null"},'
        f'"ikey":{dumps(r.idempotency_key)}}}'
        for r in rows
    ]
    return "[" + ",".join(parts) + "]"


def notify_queues(queues: Sequence[str], *, using: str = "default") -> None:
    """Wake workers of ``queues`` (PostgreSQL only; a no-op on SQLite, where workers poll)."""
    if dialect(using).postgres and queues:
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"SELECT pg_notify('{NOTIFY_CHANNEL}', q) FROM unnest(%s::text[]) AS q",
                [sorted(set(queues))],
            )
