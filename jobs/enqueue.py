"""Putting jobs on queues, from Python, the CLI and the REST API alike.

``enqueue_many`` stores any number of jobs in one statement per 1,000 jobs,
inside the caller's transaction if there is one: the jobs exist only if the
caller commits. Each job's ``job.enqueued`` event is implied by its row
(``jobs.timeline``). On PostgreSQL the same
statement sends one ``NOTIFY`` per queue (only the queue name: workers treat
it as a hint and claim from the table), and is prepared once per connection
where that is allowed (``jobs.prepared``; not behind a transaction pooler).

A job with a ``unique_key`` whose key another job holds is not stored: the
INSERT skips it (``ON CONFLICT DO NOTHING``, the database's unique index
decides, so concurrent enqueues make one job) and the holder is returned
with ``duplicate`` set (``jobs.uniqueness``). Jobs without a key cost no
extra query.

Inside a traced context (``jobs.tracing``) the call is one
``controlplane.enqueue`` span and its trace context is stored with every job
it makes, in the same INSERT; otherwise nothing is stored and no span made.
"""

from __future__ import annotations

import gc
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from jobs.clock import db_now
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.enqueue_hooks import after_enqueue
from jobs.enqueue_statement import INSERT_CONFLICT, JOB_COLUMNS, Row, statement
from jobs.exceptions import EnqueueError
from jobs.key_holders import key_holders
from jobs.models import PRIORITY_MAX, PRIORITY_MIN, Job
from jobs.operations import operation_spec
from jobs.prepared import fetch_all
from jobs.storable import first_unstorable, text_problem
from jobs.tables import JOB_TABLE
from jobs.tracing import describe_enqueue, enqueue_span, tracing_on
from jobs.uniqueness import DEFAULT_UNIQUE_WHILE, MAX_KEY_LENGTH, UniqueWhile

CHUNK = 1000
# From this many specs on, enqueue_many keeps the cyclic collector off while it works.
PAUSE_COLLECTOR_FROM = 100

# The longest per-job timeout: past it the reaper's global timeout is the better tool.
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600.0
# Inserting a key whose holder left its window between the INSERT and the read is tried again.
MAX_KEY_ROUNDS = 10


@dataclass(slots=True)
class JobSpec:
    """One job to enqueue; ``None`` fields take the operation's defaults.

    Slotted: bulk callers build thousands (a third cheaper to make than with
    an instance dict, and quicker to read back in ``_prepare``).

    ``unique_key`` with ``unique_while`` (``queued``, ``active``, the default,
    or ``until_retention``) keeps duplicates out (``jobs.uniqueness``);
    ``idempotency_key`` is the older name of a key held until retention.
    ``timeout_seconds`` bounds one run (default: the operation's).
    """

    operation: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    run_after: datetime | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    parent: uuid.UUID | str | None = None
    idempotency_key: str | None = None
    unique_key: str | None = None
    unique_while: str | None = None
    timeout_seconds: float | None = None
    # The schedule firing it (jobs.schedules.firing); stored as ``Job.schedule``.
    schedule: uuid.UUID | str | None = None


class _Batch:
    """Per-call memo: work that is the same for many specs is done once per batch.

    Bulk enqueue usually repeats one operation with one payload shape; its
    schema check and its JSON encodings are then paid once, not per row.
    """

    __slots__ = ("limit", "now", "ops", "checked", "texts", "ids")

    def __init__(self, limit: int, now: datetime, size: int = 1) -> None:
        self.limit = limit
        self.now = now
        self.ids = iter(new_job_ids(size))
        self.ops: dict[str, Any] = {}
        self.checked: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.texts: dict[str, str | None] = {}

    def op(self, name: str) -> Any:
        op = self.ops.get(name)
        if op is None:
            op = self.ops[name] = _resolve(name)
        return op

    def text_error(self, value: str) -> str | None:
        """Why a queue name or key cannot be stored (NUL, surrogate), memoised."""
        if value not in self.texts:
            self.texts[value] = text_problem(value)
        return self.texts[value]


_new_uuid = uuid.UUID.__new__
_set = object.__setattr__
_VARIANT = 0x8000 << 48  # RFC 9562 variant bits (10) at the top of octet 8


def new_job_ids(n: int) -> list[uuid.UUID]:
    """``n`` distinct, time-ordered job ids (UUIDv7, RFC 9562), ascending.

    Random version-4 ids scatter every insert across the primary key and the
    ``(job, seq)`` event index, so a big table's writes touch a random page
    each; v7 ids start with the millisecond, so a batch lands on the right
    edge of both. A batch shares its millisecond and counts up from a random
    74-bit start (RFC 9562's "monotonic random"), which keeps it ordered.
    One ``os.urandom`` call and no ``UUID.__init__`` parsing per id.
    """
    ms = time.time_ns() // 1_000_000
    start = int.from_bytes(os.urandom(10)) >> 7  # 73 random bits: start + n fits in 74
    head = (ms & 0xFFFF_FFFF_FFFF) << 80 | 7 << 76
    out = []
    for counter in range(start, start + n):
        value = _new_uuid(uuid.UUID)
        # 12 bits of the counter go after the version, 62 after the variant.
        _set(value, "int", head | (counter >> 62) << 64 | _VARIANT | counter & ((1 << 62) - 1))
        _set(value, "is_safe", uuid.SafeUUID.unknown)
        out.append(value)
    return out


_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)


class _PayloadEncoder(threading.local):
    """``_encoder.encode`` with one C encoder per thread instead of one per call.

    ``JSONEncoder.encode`` builds a C encoder for every call, which costs
    more than encoding a small payload. The encoder's ``markers`` (the
    containers being encoded, for the circular-reference check) are empty
    after each success and cleared after a failure; per thread, so two
    threads encoding the same dict never see each other's marks.
    """

    def __init__(self) -> None:
        self.markers: dict[int, Any] = {}
        self.encode = (
            _c_make_encoder(
                self.markers,
                _encoder.default,
                json.encoder.encode_basestring,  # ensure_ascii=False
                None,
                ":",
                ",",
                False,
                False,
                False,  # allow_nan
            )
            if _c_make_encoder is not None
            else None
        )


_payload_encoder = _PayloadEncoder()


def _dumps(value: Any) -> str:
    """``value`` as compact JSON (no NaN, no ASCII escaping), like ``_encoder.encode``."""
    local = _payload_encoder
    if local.encode is None:  # pragma: no cover - CPython has the C encoder
        return _encoder.encode(value)
    try:
        return "".join(local.encode(value, 0))
    except BaseException:
        local.markers.clear()
        raise


def _encode_payload(payload: dict[str, Any], limit: int) -> tuple[str, dict[str, list[str]]]:
    """Serialise a payload once and refuse what PostgreSQL and SQLite would store differently.

    NaN and infinities are not JSON; NUL (``\\u0000``) is refused by
    PostgreSQL's jsonb and lone surrogates are not Unicode. Both databases
    refuse them here, before anything is stored.
    """
    if not payload:
        return "{}", {}
    try:
        text = _dumps(payload)
    except ValueError as error:  # a non-finite float (allow_nan=False), or a cycle
        if "ircular" in str(error):
            return "", {"payload": ["The payload is not JSON: it refers to itself."]}
        found = first_unstorable(payload) or ("payload", f"is not JSON ({error})")
        return "", {found[0]: [f"The value {found[1]}."]}
    except TypeError as error:
        return "", {"payload": [f"The payload is not JSON: {error}"]}
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:
            size = -1
    if size < 0 or ("\\u0000" in text and first_unstorable(payload)):
        path, reason = first_unstorable(payload) or ("payload", "is not valid Unicode")
        return "", {path: [f"The value {reason}."]}
    if size > limit:
        return "", {"payload": [f"The payload is {size} bytes; the limit is {limit} bytes."]}
    return text, {}


def _whole(value: Any) -> bool:
    """An int but not a bool (the exact-type test first: it is the common case)."""
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _prepare(spec: JobSpec, batch: _Batch) -> tuple[Row | None, dict[str, list[str]]]:
    op = batch.op(spec.operation)
    if isinstance(op, EnqueueError):
        return None, dict(op.errors)
    payload = spec.payload
    if type(payload) is not dict and not isinstance(payload, dict):
        return None, {"payload": ["The payload must be a JSON object."]}
    payload_json, errors = _encode_payload(payload, batch.limit)
    if not errors:
        memo = (spec.operation, payload_json)
        schema_errors = batch.checked.get(memo)
        if schema_errors is None:
            schema_errors = batch.checked[memo] = op.validate(payload)
        if schema_errors:
            errors = dict(schema_errors)
    priority = spec.priority
    if not _whole(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        errors["priority"] = [
            f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        ]
    max_attempts = spec.max_attempts
    if max_attempts is not None and (not _whole(max_attempts) or not 1 <= max_attempts <= 1000):
        errors["max_attempts"] = ["max_attempts must be a whole number from 1 to 1000."]
    run_after, expires_at = spec.run_after, spec.expires_at
    if run_after is not None or expires_at is not None:
        for name, value in (("run_after", run_after), ("expires_at", expires_at)):
            if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
                errors[name] = [f"{name} must be a timezone-aware datetime."]
    queue = spec.queue
    if queue is not None:
        if not isinstance(queue, str) or not queue.strip():
            errors["queue"] = ["The queue name must be a non-empty string."]
        elif reason := batch.text_error(queue):
            errors["queue"] = [f"The queue name {reason}."]
    key, unique_while = spec.unique_key, spec.unique_while
    if key is not None or unique_while is not None or spec.idempotency_key is not None:
        key, unique_while = _unique(spec, errors)
    timeout = spec.timeout_seconds
    if timeout is None:
        timeout = getattr(op, "timeout_seconds", None)
    elif not _seconds(timeout):
        errors["timeout_seconds"] = [
            f"timeout_seconds must be a number above 0 and at most {MAX_TIMEOUT_SECONDS:g} "
            "(30 days)."
        ]
    parent_id = None
    if spec.parent:
        try:
            parent_id = (
                spec.parent if isinstance(spec.parent, uuid.UUID) else uuid.UUID(str(spec.parent))
            )
        except ValueError:
            errors["parent"] = [f"No job with id {spec.parent}."]
    schedule_id = None
    if spec.schedule is not None:
        try:
            schedule_id = uuid.UUID(str(spec.schedule))
        except ValueError:
            errors["schedule"] = [f"No schedule with id {spec.schedule}."]
    if errors:
        return None, errors
    return Row(
        next(batch.ids),
        spec.operation,
        queue or op.queue,
        payload,
        payload_json,
        priority,
        run_after or batch.now,
        expires_at,
        max_attempts or op.max_attempts,
        parent_id,
        key,
        unique_while,
        float(timeout) if timeout is not None else None,
        schedule_id,
    ), {}


def _seconds(value: Any) -> bool:
    """A finite number of seconds above 0 and within ``MAX_TIMEOUT_SECONDS`` (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_TIMEOUT_SECONDS
    )


def _unique(spec: JobSpec, errors: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """The spec's key and mode, ``idempotency_key`` read as ``until_retention``; errors added."""
    key, mode, name = spec.unique_key, spec.unique_while, "unique_key"
    if spec.idempotency_key is not None:
        if key is not None:
            errors["idempotency_key"] = [
                "Give unique_key or idempotency_key, not both: an idempotency key is a "
                "unique_key held until retention."
            ]
            return None, None
        if mode not in (None, UniqueWhile.UNTIL_RETENTION):
            errors["unique_while"] = [
                "An idempotency key is held until retention; use unique_key for "
                f"unique_while {mode!r}."
            ]
            return None, None
        key, mode, name = spec.idempotency_key, UniqueWhile.UNTIL_RETENTION.value, "idempotency_key"
    label = name.replace("_", " ")
    if key is None:
        errors["unique_while"] = ["unique_while needs a unique_key."]
    elif not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        errors[name] = [f"The {label} must be 1 to {MAX_KEY_LENGTH} characters."]
    elif reason := text_problem(key):
        errors[name] = [f"The {label} {reason}."]
    if mode is None:
        mode = DEFAULT_UNIQUE_WHILE.value
    elif mode not in UniqueWhile.values:
        errors["unique_while"] = [
            f"unique_while must be one of {', '.join(UniqueWhile.values)}, not {mode!r}."
        ]
    return key, str(mode)


def _resolve(name: str) -> Any:
    try:
        return operation_spec(name)
    except EnqueueError as error:
        return error


def enqueue_many(specs: Sequence[JobSpec], *, using: str = "default") -> list[Job]:
    """Validate and store ``specs``; return their jobs in the same order.

    Nothing is stored if any spec is invalid (``EnqueueError`` names the
    index and field). A spec whose ``unique_key`` another job holds returns
    that job instead of a new one, with ``duplicate`` set to True.
    """
    # Thousands of short-lived objects per call (specs' rows, jobs, their
    # states) would run the cyclic collector dozens of times, and its older
    # generations over the whole heap: a quarter of bulk enqueue's client CPU.
    # It runs once afterwards instead (unless someone else had switched it off).
    paused = len(specs) >= PAUSE_COLLECTOR_FROM and gc.isenabled()
    if paused:
        gc.disable()
    try:
        if not tracing_on():
            return after_enqueue(_enqueue_many(specs, using, None), using)
        with enqueue_span(len(specs)) as carrier:
            jobs = _enqueue_many(specs, using, carrier)
            describe_enqueue(jobs)
            return after_enqueue(jobs, using)
    finally:
        if paused:
            gc.enable()


def _enqueue_many(
    specs: Sequence[JobSpec], using: str, trace_context: dict[str, str] | None
) -> list[Job]:
    now = db_now(using)
    batch = _Batch(int(knob("MAX_PAYLOAD_BYTES")), now, len(specs))
    rows: list[Row] = []
    errors: dict[str, list[str]] = {}
    single = len(specs) == 1
    for index, spec in enumerate(specs):
        row, field_errors = _prepare(spec, batch)
        if row is not None:
            rows.append(row)
        for name, messages in field_errors.items():
            errors[name if single else f"{index}.{name}"] = messages
    if errors:
        if all(name.endswith("parent") for name in errors):
            raise EnqueueError("The job was not enqueued: its parent does not exist.", errors)
        raise EnqueueError("The job was not enqueued: fix the fields named in 'errors'.", errors)
    if trace_context is not None:
        for row in rows:
            row.trace_context = trace_context
    parents = {r.parent_id for r in rows if r.parent_id}
    if parents:
        found = set(Job.objects.using(using).filter(pk__in=parents).values_list("pk", flat=True))
        missing = parents - found
        if missing:
            raise EnqueueError(
                "The job was not enqueued: its parent does not exist.",
                {"parent": [f"No job with id {m}." for m in sorted(map(str, missing))]},
            )
    if not rows:
        return []
    stored: list[uuid.UUID] = []
    chunks = (
        [rows] if len(rows) <= CHUNK else [rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)]
    )
    if len(chunks) == 1 and dialect(using).postgres:
        # One PostgreSQL statement is atomic on its own: no BEGIN/COMMIT round
        # trips. SQLite's _insert is two statements (jobs, then events).
        stored = _insert_postgres(chunks[0], now, using)
    else:
        with transaction.atomic(using=using):
            for chunk in chunks:
                stored += _insert(chunk, now, using=using)
    if len(stored) == len(rows):  # the usual case: no unique key was held elsewhere
        return [_job(r, now, using) for r in rows]
    inserted = set(stored)
    skipped = [r for r in rows if r.id not in inserted]
    holders = _holders(skipped, inserted, now, using)
    return [_job(r, now, using) if r.id in inserted else holders[r.unique_key] for r in rows]


def _holders(
    skipped: list[Row], inserted: set[uuid.UUID], now: datetime, using: str
) -> dict[str | None, Job]:
    """The jobs holding the keys of ``skipped`` rows, marked ``duplicate``, by key.

    A holder may leave its window (start, finish) between the INSERT that
    met it and this read: the rows of such keys are inserted again, until
    each key is held by a job this call made or found. ``inserted`` gains
    the ids of the rows stored on a later round.
    """
    found: dict[str | None, Job] = {}
    for _ in range(MAX_KEY_ROUNDS):
        wanted = {r.unique_key for r in skipped if r.unique_key and r.unique_key not in found}
        for key, job in key_holders(wanted, using=using).items():
            job.duplicate = True
            found[key] = job
        # One row per key that nobody holds now; the others wait for its outcome.
        again = list(
            {r.unique_key: r for r in reversed(skipped) if r.unique_key not in found}.values()
        )
        if not again:
            return found
        with transaction.atomic(using=using):
            stored = set(_insert(again, now, using=using))
        inserted |= stored
        skipped = [r for r in skipped if r.id not in stored]
    raise EnqueueError(
        "The job was not enqueued: its unique key kept changing hands; try again.",
        {"unique_key": ["The key's holder kept leaving its window during the enqueue."]},
    )


def enqueue(operation: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
    """Enqueue one job. Options are the fields of ``JobSpec``."""
    using = options.pop("using", "default")
    spec = JobSpec(operation=operation, payload=payload if payload is not None else {}, **options)
    return enqueue_many([spec], using=using)[0]


def _job(row: Row, now: datetime, using: str) -> Job:
    """The stored job as a model instance, built without Model.__init__'s per-field work.

    Bulk enqueue returns thousands of these; the full constructor alone would
    cost more than the INSERT. The fields every new job shares come from one
    template dict per batch (``_job_template``).
    """
    job = _new_job(Job)
    values = job.__dict__
    values.update(_job_template(now))
    values["id"] = row.id
    values["operation"] = row.operation
    values["queue"] = row.queue
    values["payload"] = row.payload
    values["priority"] = row.priority
    values["run_after"] = row.run_after
    values["expires_at"] = row.expires_at
    values["max_attempts"] = row.max_attempts
    values["parent_id"] = row.parent_id
    values["unique_key"] = row.unique_key
    values["unique_while"] = row.unique_while
    values["timeout_seconds"] = row.timeout_seconds
    values["schedule_id"] = row.schedule_id
    values["trace_context"] = row.trace_context
    state = values["_state"] = _new_state(ModelState)
    state.db = using
    state.adding = False
    return job


_new_job = Job.__new__
_new_state = ModelState.__new__
_template: tuple[datetime, dict[str, Any]] | None = None


def _job_template(now: datetime) -> dict[str, Any]:
    global _template
    if _template is None or _template[0] is not now:
        _template = (
            now,
            {
                "status": "queued",
                "attempts": 0,
                "lease_requeues": 0,
                "progress_current": 0,
                "progress_total": None,
                "leased_until": None,
                "lease_token": None,
                "worker_id": None,
                "result": None,
                "error_code": "",
                "error_message": "",
                "created_at": now,
                "started_at": None,
                "finished_at": None,
                "last_event_seq": 1,
                "last_event_at": now,
            },
        )
    return _template[1]


def _insert_postgres(rows: list[Row], now: datetime, using: str) -> list[uuid.UUID]:
    """One statement (``jobs.enqueue_statement``), prepared once per connection where allowed."""
    returned = fetch_all(using, *statement(rows, now), unless_rowcount=len(rows))
    if returned is None:  # every row was stored: nothing to read back
        return [r.id for r in rows]
    return [row[0] for row in returned]


def _insert(rows: list[Row], now: datetime, *, using: str) -> list[uuid.UUID]:
    """Insert jobs (their ``job.enqueued`` events are implied: ``jobs.timeline``); return the
    ids actually inserted."""
    d = dialect(using)
    if d.postgres:
        return _insert_postgres(rows, now, using)
    with connections[using].cursor() as cursor:
        values = (
            "(%s, %s, %s, %s, 'queued', %s, %s, %s, 0, %s, 0, %s, 0, NULL, '', '', %s, %s, 1, %s, "
            "%s, %s, %s, %s)"
        )
        params: list[Any] = []
        created = d.ts(now)
        for r in rows:
            params += [
                d.uuid(r.id),
                r.operation,
                r.queue,
                r.payload_json,
                r.priority,
                d.ts(r.run_after),
                d.ts(r.expires_at),
                r.max_attempts,
                d.uuid(r.parent_id),
                created,
                r.unique_key,
                created,
                r.unique_while,
                r.timeout_seconds,
                d.uuid(r.schedule_id),
                d.json(r.trace_context) if r.trace_context is not None else None,
            ]
        cursor.execute(
            f"INSERT INTO {JOB_TABLE} ({JOB_COLUMNS}) "
            f"VALUES {', '.join([values] * len(rows))} "
            f"{INSERT_CONFLICT} RETURNING id",
            params,
        )
        return [d.read_id(row[0]) for row in cursor.fetchall()]
