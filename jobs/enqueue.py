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

The steps live in their own modules: ``jobs.job_spec`` (a ``JobSpec`` checked
into a row), ``jobs.ids`` (UUIDv7 job ids), ``jobs.payload_json`` (the
payload's JSON, made once) and ``jobs.enqueue_statement`` (the INSERT).
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models.base import ModelState

from jobs.clock import db_now
from jobs.conf import knob
from jobs.dependencies import link, plan_links
from jobs.enqueue_hooks import after_enqueue
from jobs.enqueue_statement import Row, insert_postgres, insert_rows
from jobs.exceptions import EnqueueError
from jobs.fair_turns import assign_turns
from jobs.flow_keys import Key, declared_keys
from jobs.job_spec import MAX_TIMEOUT_SECONDS, JobSpec, SpecBatch, again, prepare_row  # noqa: F401
from jobs.key_holders import key_holders
from jobs.key_limits import ensure_declared
from jobs.models import Job, Workflow
from jobs.operations import operation_spec
from jobs.tracing import describe_enqueue, enqueue_span, tracing_on

CHUNK = 1000
# From this many specs on, enqueue_many keeps the cyclic collector off while it works.
PAUSE_COLLECTOR_FROM = 100
# Inserting a key whose holder left its window between the INSERT and the read is tried again.
MAX_KEY_ROUNDS = 10


def enqueue(operation: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
    """Enqueue one job. Options are the fields of ``JobSpec``."""
    using = options.pop("using", "default")
    spec = JobSpec(operation=operation, payload=payload if payload is not None else {}, **options)
    return enqueue_many([spec], using=using)[0]


@dataclass
class Graph:
    """What makes an ``enqueue_many`` call a workflow: its row, stored first, and step names."""

    workflow: Workflow | None = None
    steps: list[str] | None = None


def enqueue_many(
    specs: Sequence[JobSpec], *, using: str = "default", graph: Graph | None = None
) -> list[Job]:
    """Validate and store ``specs``; return their jobs in the same order.

    Nothing is stored if any spec is invalid (``EnqueueError`` names the
    index and field). A spec whose ``unique_key`` another job holds returns
    that job instead of a new one, with ``duplicate`` set to True. Specs with
    ``depends_on`` are linked in the same transaction (``jobs.dependencies``);
    ``graph`` is how ``jobs.workflows`` stores a workflow with its steps.
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
            return after_enqueue(_enqueue_many(specs, using, None, graph), using)
        with enqueue_span(len(specs)) as carrier:
            jobs = _enqueue_many(specs, using, carrier, graph)
            describe_enqueue(jobs)
            return after_enqueue(jobs, using)
    finally:
        if paused:
            gc.enable()


def _enqueue_many(
    specs: Sequence[JobSpec],
    using: str,
    trace_context: dict[str, str] | None,
    graph: Graph | None = None,
) -> list[Job]:
    """Check every spec, then store the rows; a held unique key returns its holder."""
    now = db_now(using)
    rows = _rows(specs, SpecBatch(int(knob("MAX_PAYLOAD_BYTES")), now, len(specs)))
    if trace_context is not None:
        for row in rows:
            row.trace_context = trace_context
    _check_parents(rows, using)
    if not rows:
        return []
    keyed = any(r.fair_key is not None for r in rows)
    if keyed:
        _declare_limits(specs, rows, using)
    if graph is not None or any(s.depends_on for s in specs):
        return _store_graph(specs, rows, graph or Graph(), now, using)
    stored = _store(rows, now, using, keyed)
    if len(stored) == len(rows):  # the usual case: no unique key was held elsewhere
        return _jobs(rows, now, using)
    inserted = set(stored)
    skipped = [r for r in rows if r.id not in inserted]
    holders = _holders(skipped, inserted, now, using)
    return [_job(r, now, using) if r.id in inserted else holders[r.unique_key] for r in rows]


def _rows(specs: Sequence[JobSpec], batch: SpecBatch) -> list[Row]:
    """The specs' rows, or ``EnqueueError`` naming every field of every spec in error."""
    rows: list[Row] = []
    errors: dict[str, list[str]] = {}
    single = len(specs) == 1
    last: JobSpec | None = None
    row: Row | None = None
    for index, spec in enumerate(specs):
        if spec is last and row is not None and row.retry_policy is None and row.flow_keys is None:
            # The same spec again (``[JobSpec(...)] * n``): the same row under the next id.
            row = again(row, batch)
            rows.append(row)
            continue
        row, field_errors = prepare_row(spec, batch)
        last = spec
        if row is not None:
            rows.append(row)
        elif field_errors:
            for name, messages in field_errors.items():
                errors[name if single else f"{index}.{name}"] = messages
    if errors:
        if all(name.endswith("parent") for name in errors):
            raise EnqueueError("The job was not enqueued: its parent does not exist.", errors)
        raise EnqueueError("The job was not enqueued: fix the fields named in 'errors'.", errors)
    return rows


def _check_parents(rows: list[Row], using: str) -> None:
    """``EnqueueError`` unless every parent the rows name exists."""
    parents = {r.parent_id for r in rows if r.parent_id}
    if parents:
        found = set(Job.objects.using(using).filter(pk__in=parents).values_list("pk", flat=True))
        missing = parents - found
        if missing:
            raise EnqueueError(
                "The job was not enqueued: its parent does not exist.",
                {"parent": [f"No job with id {m}." for m in sorted(map(str, missing))]},
            )


def _store(rows: list[Row], now: datetime, using: str, keyed: bool) -> list[uuid.UUID]:
    """Insert the rows, ``CHUNK`` per statement, all or none; return the ids inserted.

    Keyed rows (a fair key) take their fair turns (``jobs.fair_turns``) in the same transaction.
    """
    if len(rows) <= CHUNK and not keyed and connections[using].vendor == "postgresql":
        # One PostgreSQL statement is atomic on its own: no BEGIN/COMMIT round
        # trips. SQLite's insert is two statements (jobs, then events).
        return insert_postgres(rows, now, using)
    chunks = (
        [rows] if len(rows) <= CHUNK else [rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)]
    )
    stored: list[uuid.UUID] = []
    with transaction.atomic(using=using):
        if keyed:
            assign_turns(rows, using)
        for chunk in chunks:
            stored += insert_rows(chunk, now, using)
    return stored


def _store_graph(
    specs: Sequence[JobSpec], rows: list[Row], graph: Graph, now: datetime, using: str
) -> list[Job]:
    """Store jobs with dependencies between them (and their workflow) in one transaction."""
    ids = [r.id for r in rows]
    links = plan_links(specs, ids)
    waiting = [r.id for r, s in zip(rows, specs, strict=True) if s.depends_on]
    for row, spec in zip(rows, specs, strict=True):
        if spec.depends_on:
            row.run_after = None  # claimable once its dependencies are met
    steps = dict(zip(ids, graph.steps, strict=True)) if graph.steps else None
    keyed = any(r.fair_key is not None for r in rows)
    with transaction.atomic(using=using):
        if graph.workflow is not None:
            graph.workflow.created_at = now
            graph.workflow.save(using=using, force_insert=True)
        if keyed:
            assign_turns(rows, using)
        for start in range(0, len(rows), CHUNK):
            insert_rows(rows[start : start + CHUNK], now, using)
        linked = link(
            links,
            waiting=waiting,
            workflow_id=graph.workflow.pk if graph.workflow is not None else None,
            steps=steps,
            using=using,
        )
    if linked.cancelled:  # some were cancelled at once: read them as they are
        found = Job.objects.using(using).in_bulk(ids)
        return [found[i] for i in ids]
    jobs = [_job(r, now, using) for r in rows]
    for job in jobs:
        values = job.__dict__
        values["waiting_for"] = linked.unmet.get(job.id, 0)
        values["has_dependents"] = job.id in linked.upstreams
        if graph.workflow is not None:
            values["workflow_id"] = graph.workflow.pk
            values["step"] = steps[job.id] if steps else ""
        if values["waiting_for"] == 0 and job.run_after is None:
            values["run_after"] = now  # met at once: claimable from the enqueue's instant
    return jobs


def _declare_limits(specs: Sequence[JobSpec], rows: list[Row], using: str) -> None:
    """Create the limit rows that keyed jobs' declarations name and nobody set yet."""
    declared: list[Key] = []
    seen = set()
    for row in rows:
        if row.fair_key is not None and row.operation not in seen:
            seen.add(row.operation)
            declared.extend(declared_keys(operation_spec(row.operation)))
    for spec in specs:
        declared.extend(k for k in spec.keys or () if isinstance(k, Key))
    ensure_declared(declared, using)


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
            stored = set(insert_rows(again, now, using))
        inserted |= stored
        skipped = [r for r in skipped if r.id not in stored]
    raise EnqueueError(
        "The job was not enqueued: its unique key kept changing hands; try again.",
        {"unique_key": ["The key's holder kept leaving its window during the enqueue."]},
    )


def _job(row: Row, now: datetime, using: str) -> Job:
    """The stored job as a model instance, built without Model.__init__'s per-field work.

    Bulk enqueue returns thousands of these; the full constructor alone would
    cost more than the INSERT. The fields every new job shares come from one
    constant dict (``_NEW_JOB``).
    """
    job = _new_job(Job)
    values = job.__dict__
    values.update(_NEW_JOB)
    values["created_at"] = values["last_event_at"] = now
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
    values["retry_policy"] = row.retry_policy
    values["flow_keys"] = row.flow_keys
    values["fair_key"] = row.fair_key
    values["fair_turn"] = row.fair_turn
    state = values["_state"] = _new_state(ModelState)
    state.db = using
    state.adding = False
    return job


def _jobs(rows: list[Row], now: datetime, using: str) -> list[Job]:
    """``_job`` of each row; a row repeating the one before (``again``) copies its job's fields.

    Such a row differs from the previous one only in its id, so its job is the
    previous job's fields with that id and a state of its own: one dict copy
    instead of twenty assignments.
    """
    jobs: list[Job] = []
    append = jobs.append
    origin: Row | None = None  # the row whose job ``values`` are
    values: dict[str, Any] = {}
    for row in rows:
        if origin is not None and row.repeats is origin:
            job = _new_job(Job)
            copied = values.copy()
            copied["id"] = row.id
            state = copied["_state"] = _new_state(ModelState)
            state.db = using
            state.adding = False
            job.__dict__ = copied
        else:
            job = _job(row, now, using)
            values = job.__dict__
            origin = row.repeats or row
        append(job)
    return jobs


_new_job = Job.__new__
_new_state = ModelState.__new__
# A new job's fields that no spec sets (created_at and last_event_at are the enqueue's time).
_NEW_JOB: dict[str, Any] = {
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
    "started_at": None,
    "finished_at": None,
    "last_event_seq": 1,
    "retry_laters": 0,
    "priority_aged": 0,
    "waiting_for": 0,
    "has_dependents": False,
    "workflow_id": None,
    "step": "",
}
