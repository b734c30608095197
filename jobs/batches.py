"""Batch queues: coordinators, ephemeral batch messages and the write step.

A coordinator operation dispatches N messages to ``<queue>.batch`` (no Job
rows: one table used like a message queue with a visibility timeout) and
returns deferred. A batch consumer processes a message and hands its output
to ``<queue>.write``; the write step records it once (``BatchReceipt``),
advances the parent's ``progress_current`` with one guarded UPDATE, and the
write that reaches ``progress_total`` closes the parent.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import connections, transaction
from django.utils import timezone

from jobs import transitions
from jobs.clock import db_now
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.events import BATCH_DISPATCHED, BATCH_WRITTEN
from jobs.exceptions import ControlPlaneError, LeaseLost
from jobs.models import BatchMessage, BatchReceipt, Job, Queue, QueueKind
from jobs.operations import validate_against_schema
from jobs.states import RUNNING
from jobs.tables import BATCH_MESSAGE_TABLE, BATCH_RECEIPT_TABLE, JOB_TABLE
from jobs.wakeups import notify_queues

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
log = logging.getLogger("workers")


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

    Idempotent per run: a coordinator that runs again (its lease expired
    after a dispatch, or an operator retried it) starts over. In the same
    transaction as the reset count, the parent's earlier messages and
    receipts are deleted, so no batch is counted twice and no old receipt
    blocks a recount. The parent's row is locked first, as the write step
    and cancel lock it, so these never deadlock.
    """
    op = batch_registry.get(operation)
    for index, payload in enumerate(payloads):
        errors = validate_against_schema(payload, op.payload_schema)
        if errors:
            raise ControlPlaneError(f"Batch {index} payload is invalid: {errors}")
    batch_queue, write_queue = batch_queue_names(queue or ctx.job.queue)
    _ensure_batch_queues(batch_queue, write_queue)
    now = db_now()
    attempts = op.max_attempts or int(knob("BATCH_MAX_ATTEMPTS"))
    with transaction.atomic():
        updated = Job.objects.filter(
            pk=ctx.job_id, status=RUNNING, lease_token=ctx.job.lease_token
        ).update(progress_total=len(payloads), progress_current=0)
        if not updated:
            raise LeaseLost(ctx.job_id)
        replaced, _ = BatchMessage.objects.filter(parent_id=ctx.job_id).delete()
        forgotten, _ = BatchReceipt.objects.filter(parent_id=ctx.job_id).delete()
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
    again = {"replaced_messages": replaced, "replaced_receipts": forgotten}
    ctx.emit(
        BATCH_DISPATCHED,
        f"{len(payloads)} batches to {batch_queue}",
        batches=len(payloads),
        **(again if replaced or forgotten else {}),
    )
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
    # In the statement, on the database's clock: every message stamped from a reading of
    # it (which never runs ahead) is visible at once, whichever process stamped it.
    at = timezone.now()
    now_sql, now_params = d.now(at=at)
    until_sql, until_params = d.now(visibility_seconds, at=at)
    pick = (
        f"SELECT id FROM {BATCH_MESSAGE_TABLE} WHERE queue = %s AND visible_after <= {now_sql} "
        "ORDER BY visible_after, id LIMIT %s"
    )
    if d.postgres:
        pick += " FOR UPDATE SKIP LOCKED"
    with transaction.atomic(), connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {BATCH_MESSAGE_TABLE} SET visible_after = {until_sql}, "
            f"attempts = attempts + 1 WHERE id IN ({pick}) "
            "RETURNING id, queue, parent_id, operation, batch_index, payload, attempts, "
            "max_attempts, last_error",
            [*until_params, queue, *now_params, limit],
        )
        rows = cursor.fetchall()
    # (message, its last_error): the poisoned are failed below, the rest returned.
    claimed: list[tuple[ClaimedMessage, str]] = []
    poisoned: list[tuple[ClaimedMessage, str]] = []
    for r in sorted(rows, key=lambda r: r[0]):
        message = ClaimedMessage(
            id=r[0],
            queue=r[1],
            parent_id=d.read_id(r[2]),
            operation=r[3],
            batch_index=r[4],
            payload=d.read_json(r[5]) or {},
            attempts=r[6],
            max_attempts=r[7],
        )
        (poisoned if message.attempts > message.max_attempts else claimed).append((message, r[8]))
    for message, last_error in poisoned:
        _fail_poisoned(message, last_error or "")
    return [message for message, _ in claimed]


def _fail_poisoned(message: ClaimedMessage, last_error: str) -> None:
    """A message whose every delivery ended with its consumer dead (killed, OOM) fails its parent.

    Consumers that die never reach ``fail_batch``, so the claim is where the
    attempt budget is enforced: the delivery past ``max_attempts`` is not
    handed out, and the parent fails naming the batch.
    """
    spent = message.attempts - 1
    detail = f" Last error: {last_error}" if last_error else ""
    _fail_parent(
        message,
        f"Batch {message.batch_index} ({message.operation}) was delivered {spent} times and "
        f"never finished on {message.queue} (its consumer died each time).{detail}",
    )
    log.error(
        "batch.poisoned message=%s parent=%s batch=%d deliveries=%d",
        message.id,
        message.parent_id,
        message.batch_index,
        spent,
    )


def _fail_parent(message: ClaimedMessage, error_message: str) -> None:
    """Fail the parent of ``message`` with ``BatchFailed`` and drop all its messages, atomically."""
    with transaction.atomic():
        try:
            transitions.fail_job(
                message.parent_id,
                lease_token=None,
                error_code="BatchFailed",
                error_message=error_message,
            )
        except ControlPlaneError:
            pass  # the parent is no longer running; nothing left to fail
        BatchMessage.objects.filter(parent_id=message.parent_id).delete()


def parent_running(parent_id: uuid.UUID) -> bool:
    return Job.objects.filter(pk=parent_id, status=RUNNING).exists()


def drop_message(message: ClaimedMessage) -> None:
    """Ack a message without doing its work (its parent stopped running)."""
    _ack(message)


def hand_to_write_queue(message: ClaimedMessage, output: Any) -> bool:
    """Ack a processed batch by replacing it with its write message, atomically.

    The ack is fenced by the delivery (``attempts`` as claimed): a consumer
    whose visibility ran out while another took the message over acks
    nothing, and returns False; so does one whose parent dropped its messages.
    """
    _, write_queue = batch_queue_names(message.queue)
    # The database's time, as claims compare it (not the model's default, this host's clock:
    # a consumer whose reading of the database's clock lags found such a message invisible).
    now = db_now()
    with transaction.atomic():
        deleted, _ = BatchMessage.objects.filter(pk=message.id, attempts=message.attempts).delete()
        if not deleted:
            return False
        BatchMessage.objects.create(
            queue=write_queue,
            parent_id=message.parent_id,
            operation=message.operation,
            batch_index=message.batch_index,
            payload={"output": output},
            max_attempts=message.max_attempts,
            visible_after=now,
            created_at=now,
        )
        notify_queues([write_queue])
    return True


def fail_batch(message: ClaimedMessage, error: BaseException) -> bool:
    """Retry a failed batch later, or fail the parent when its attempts are spent.

    Returns True when the parent was failed (and its other messages dropped).
    The retry is fenced by the delivery, like the ack.
    """
    text = f"{type(error).__name__}: {error}"
    if message.attempts < message.max_attempts:
        backoff = float(knob("RETRY_BACKOFF_SECONDS")) * 2 ** (message.attempts - 1)
        BatchMessage.objects.filter(pk=message.id, attempts=message.attempts).update(
            visible_after=db_now() + timedelta(seconds=backoff), last_error=text[:2000]
        )
        return False
    _fail_parent(
        message,
        f"Batch {message.batch_index} ({message.operation}) failed after "
        f"{message.attempts} attempts: {text}",
    )
    return True


class _ParentGone(Exception):
    """The parent stopped running during a write: roll the write back."""


def write_batch(message: ClaimedMessage) -> str:
    """The write step: record the output once, advance the parent, close it at the total.

    One transaction: the receipt insert (a duplicate delivery inserts
    nothing and counts nothing), the batch's domain write, the atomic
    increment, the closing transition, and the fenced ack. A parent that is
    no longer running gets no domain work: it is checked first (cheap), and
    if it stops before the increment the whole write rolls back.

    Only a deferred parent (its lease released) is closed here; while its
    coordinator still holds the lease, the count goes on and ``defer_job``
    closes it. Returns ``closed_parent``, ``written``, ``duplicate`` or ``dropped``.
    """
    d = dialect()
    op = batch_registry.get(message.operation)
    output = message.payload.get("output")
    now = db_now()
    if not parent_running(message.parent_id):
        _ack(message)
        return "dropped"
    try:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            outcome = _write(cursor, d, op, message, output, now)
            _ack(message, cursor)
    except _ParentGone:
        _ack(message)
        return "dropped"
    return outcome


def _write(
    cursor: Any, d: Any, op: BatchOperation, message: ClaimedMessage, output: Any, now: Any
) -> str:
    cursor.execute(
        f"INSERT INTO {BATCH_RECEIPT_TABLE} (parent_id, batch_index, output, written_at) "
        f"VALUES (%s, %s, {d.json_param}, %s) "
        "ON CONFLICT (parent_id, batch_index) DO NOTHING RETURNING id",
        [d.uuid(message.parent_id), message.batch_index, d.json(output), d.ts(now)],
    )
    if not cursor.fetchall():
        return "duplicate"
    op.write(message.parent_id, message.batch_index, output)
    cursor.execute(
        f"UPDATE {JOB_TABLE} SET progress_current = progress_current + 1, "
        "last_event_seq = last_event_seq + 1, last_event_at = %s "
        "WHERE id = %s AND status = 'running' "
        "RETURNING id, last_event_seq, progress_current, progress_total, lease_token",
        [d.ts(now), d.uuid(message.parent_id)],
    )
    rows = cursor.fetchall()
    if not rows:
        raise _ParentGone
    db_id, seq, current, total, lease_token = rows[0]
    transitions.write_events(
        cursor,
        d,
        [(db_id, seq)],
        transitions.Event(
            BATCH_WRITTEN,
            fields={
                "batch": message.batch_index,
                "_progress_current": current,
                "_progress_total": total,
            },
        ),
        now,
    )
    if total is None or current < total or lease_token is not None:
        return "written"
    transitions.complete_job(
        message.parent_id,
        lease_token=None,
        result=_parent_result(message.parent_id, total),
    )
    return "closed_parent"


def _ack(message: ClaimedMessage, cursor: Any = None) -> None:
    """Delete the message if this delivery still holds it (fenced by ``attempts``)."""
    if cursor is None:
        BatchMessage.objects.filter(pk=message.id, attempts=message.attempts).delete()
        return
    cursor.execute(
        f"DELETE FROM {BATCH_MESSAGE_TABLE} WHERE id = %s AND attempts = %s",
        [message.id, message.attempts],
    )


def _parent_result(parent_id: uuid.UUID, total: int) -> Any:
    result = Job.objects.filter(pk=parent_id).values_list("result", flat=True).first()
    return transitions.deferred_result(result, total)
