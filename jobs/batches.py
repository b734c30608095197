"""Batch queues: coordinators, ephemeral batch messages and the write step.

A coordinator operation dispatches N messages to ``<queue>.batch`` (no Job
rows: one table used like a message queue with a visibility timeout) and
returns deferred. A batch consumer processes a message and hands its output
to ``<queue>.write``; the write step records it once (``BatchReceipt``),
advances the parent's ``progress_current`` with one guarded UPDATE, and the
write that reaches ``progress_total`` closes the parent.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import connections, transaction
from django.utils import timezone

from jobs import transitions
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.enqueue import notify_queues
from jobs.exceptions import ControlPlaneError, LeaseLost
from jobs.models import BatchMessage, Job, Queue, QueueKind
from jobs.operations import validate_against_schema
from jobs.states import RUNNING

if TYPE_CHECKING:
    from jobs.operations import JobContext


class BatchOperation:
    """The work of one batch message: ``process`` runs on ``*.batch`` consumers.

    Everything it needs travels in its payload (a snapshot taken at dispatch),
    so it never reads rows that may change mid-run.
    """

    name: ClassVar[str] = ""
    payload_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    max_attempts: ClassVar[int | None] = None

    def process(self, payload: dict[str, Any]) -> Any:
        raise NotImplementedError

    def write(self, parent_id: uuid.UUID, batch_index: int, output: Any) -> None:
        """Store a batch's output; runs in the write step's transaction.

        The default keeps the output on the batch's receipt; override to write
        domain rows (they commit with the progress increment, or not at all).
        """


class BatchRegistry:
    def __init__(self) -> None:
        self._ops: dict[str, BatchOperation] = {}

    def register(self, cls: type[BatchOperation]) -> type[BatchOperation]:
        self._ops[cls.name] = cls()
        return cls

    def get(self, name: str) -> BatchOperation:
        try:
            return self._ops[name]
        except KeyError:
            raise ControlPlaneError(f"Unknown batch operation {name!r}; register it.") from None


batch_registry = BatchRegistry()


def batch_queue_names(queue: str) -> tuple[str, str]:
    base = queue.removesuffix(".batch").removesuffix(".write")
    return f"{base}.batch", f"{base}.write"


def _ensure_batch_queues(*names: str) -> None:
    for name in names:
        Queue.objects.get_or_create(name=name, defaults={"kind": QueueKind.BATCH})


def dispatch_batches(
    ctx: JobContext, *, operation: str, payloads: Sequence[dict[str, Any]], queue: str | None = None
) -> int:
    """Send one message per payload to the batch queue and set the parent's ``progress_total``.

    One INSERT for all messages; payloads are validated against the batch
    operation's schema first, so a bad snapshot fails the coordinator, not a batch.
    """
    op = batch_registry.get(operation)
    for index, payload in enumerate(payloads):
        errors = validate_against_schema(payload, op.payload_schema)
        if errors:
            raise ControlPlaneError(f"Batch {index} payload is invalid: {errors}")
    batch_queue, write_queue = batch_queue_names(queue or ctx.job.queue)
    _ensure_batch_queues(batch_queue, write_queue)
    now = timezone.now()
    attempts = op.max_attempts or int(knob("BATCH_MAX_ATTEMPTS"))
    with transaction.atomic():
        updated = Job.objects.filter(
            pk=ctx.job_id, status=RUNNING, lease_token=ctx.job.lease_token
        ).update(progress_total=len(payloads), progress_current=0)
        if not updated:
            raise LeaseLost(ctx.job_id)
        BatchMessage.objects.bulk_create(
            [
                BatchMessage(
                    queue=batch_queue,
                    parent_id=ctx.job_id,
                    operation=operation,
                    batch_index=index,
                    payload=payload,
                    max_attempts=attempts,
                    visible_after=now,
                    created_at=now,
                )
                for index, payload in enumerate(payloads)
            ],
            batch_size=1000,
        )
        notify_queues([batch_queue])
    ctx.emit("batch.dispatched", f"{len(payloads)} batches to {batch_queue}", batches=len(payloads))
    return len(payloads)


@dataclass(frozen=True)
class ClaimedMessage:
    id: int
    queue: str
    parent_id: uuid.UUID
    operation: str
    batch_index: int
    payload: dict[str, Any]
    attempts: int
    max_attempts: int


def claim_messages(*, queue: str, limit: int, visibility_seconds: float) -> list[ClaimedMessage]:
    """Make up to ``limit`` visible messages invisible for ``visibility_seconds`` and return them.

    A consumer that dies leaves its messages to reappear when that time passes.
    """
    if limit <= 0:
        return []
    d = dialect()
    now = timezone.now()
    pick = (
        "SELECT id FROM jobs_batchmessage WHERE queue = %s AND visible_after <= %s "
        "ORDER BY visible_after, id LIMIT %s"
    )
    if d.postgres:
        pick += " FOR UPDATE SKIP LOCKED"
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_batchmessage SET visible_after = %s, attempts = attempts + 1 "
            f"WHERE id IN ({pick}) "
            "RETURNING id, queue, parent_id, operation, batch_index, payload, attempts, max_attempts",
            [d.ts(now + timedelta(seconds=visibility_seconds)), queue, d.ts(now), limit],
        )
        rows = cursor.fetchall()
    return [
        ClaimedMessage(
            id=r[0],
            queue=r[1],
            parent_id=d.read_uuid(r[2]),
            operation=r[3],
            batch_index=r[4],
            payload=d.read_json(r[5]) or {},
            attempts=r[6],
            max_attempts=r[7],
        )
        for r in sorted(rows, key=lambda r: r[0])
    ]


def parent_running(parent_id: uuid.UUID) -> bool:
    return Job.objects.filter(pk=parent_id, status=RUNNING).exists()


def drop_message(message: ClaimedMessage) -> None:
    BatchMessage.objects.filter(pk=message.id).delete()


def hand_to_write_queue(message: ClaimedMessage, output: Any) -> None:
    """Ack a processed batch by replacing it with its write message, atomically."""
    _, write_queue = batch_queue_names(message.queue)
    with transaction.atomic():
        deleted, _ = BatchMessage.objects.filter(pk=message.id).delete()
        if not deleted:
            return  # the parent was cancelled or failed meanwhile; its messages are gone
        BatchMessage.objects.create(
            queue=write_queue,
            parent_id=message.parent_id,
            operation=message.operation,
            batch_index=message.batch_index,
            payload={"output": output},
            max_attempts=message.max_attempts,
        )
        notify_queues([write_queue])


def fail_batch(message: ClaimedMessage, error: BaseException) -> bool:
    """Retry a failed batch later, or fail the parent when its attempts are spent.

    Returns True when the parent was failed (and its other messages dropped).
    """
    text = f"{type(error).__name__}: {error}"
    if message.attempts < message.max_attempts:
        backoff = float(knob("RETRY_BACKOFF_SECONDS")) * 2 ** (message.attempts - 1)
        BatchMessage.objects.filter(pk=message.id).update(
            visible_after=timezone.now() + timedelta(seconds=backoff), last_error=text
        )
        return False
    with transaction.atomic():
        try:
            transitions.fail_job(
                message.parent_id,
                lease_token=None,
                error_code="BatchFailed",
                error_message=(
                    f"Batch {message.batch_index} ({message.operation}) failed after "
                    f"{message.attempts} attempts: {text}"
                ),
            )
        except ControlPlaneError:
            pass  # the parent is no longer running; nothing left to fail
        BatchMessage.objects.filter(parent_id=message.parent_id).delete()
    return True


def write_batch(message: ClaimedMessage) -> bool:
    """The write step: record the output once, advance the parent, close it at the total.

    One transaction: the receipt insert (a duplicate delivery inserts
    nothing and counts nothing), the atomic increment, the closing
    transition, and the ack. Returns True if this write closed the parent.
    """
    d = dialect()
    op = batch_registry.get(message.operation)
    output = message.payload.get("output")
    now = timezone.now()
    closed = False
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute(
            "INSERT INTO jobs_batchreceipt (parent_id, batch_index, output, written_at) "
            f"VALUES (%s, %s, {d.json_param}, %s) "
            "ON CONFLICT (parent_id, batch_index) DO NOTHING RETURNING id",
            [d.uuid(message.parent_id), message.batch_index, d.json(output), d.ts(now)],
        )
        first_delivery = bool(cursor.fetchall())
        if first_delivery:
            op.write(message.parent_id, message.batch_index, output)
            cursor.execute(
                "UPDATE jobs_job SET progress_current = progress_current + 1, "
                "last_event_seq = last_event_seq + 1, last_event_at = %s "
                "WHERE id = %s AND status = 'running' "
                "RETURNING id, last_event_seq, progress_current, progress_total",
                [d.ts(now), d.uuid(message.parent_id)],
            )
            rows = cursor.fetchall()
            if rows:
                _, seq, current, total = rows[0]
                transitions.write_events(
                    cursor,
                    d,
                    [(rows[0][0], seq)],
                    transitions.Event(
                        "batch.written",
                        fields={
                            "batch": message.batch_index,
                            "_progress_current": current,
                            "_progress_total": total,
                        },
                    ),
                    now,
                )
                if total is not None and current >= total:
                    transitions.complete_job(
                        message.parent_id,
                        lease_token=None,
                        result=_parent_result(message.parent_id, total),
                    )
                    closed = True
        cursor.execute("DELETE FROM jobs_batchmessage WHERE id = %s", [message.id])
    return closed


def _parent_result(parent_id: uuid.UUID, total: int) -> dict[str, Any]:
    result = Job.objects.filter(pk=parent_id).values_list("result", flat=True).first()
    merged = dict(result) if isinstance(result, dict) else {}
    merged["batches_written"] = total
    return merged
