"""Running one batch message: process on ``*.batch`` queues, write on ``*.write`` queues."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import F

from jobs import batches
from jobs.clock import db_now
from jobs.models import BatchMessage

log = logging.getLogger("workers")


@dataclass
class MessageFlight:
    message: batches.ClaimedMessage
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)


def run_message(flight: MessageFlight) -> str:
    """Process or write one message; returns what happened, for the log line."""
    message = flight.message
    started = time.monotonic()
    try:
        if not batches.parent_running(message.parent_id):
            batches.drop_message(message)
            outcome = "dropped"
        elif message.queue.endswith(".write"):
            outcome = batches.write_batch(message)
        else:
            op = batches.batch_registry.get(message.operation)
            output = op.process(message.payload)
            outcome = "processed" if batches.hand_to_write_queue(message, output) else "superseded"
    except Exception as error:  # noqa: BLE001 - a failed batch is retried or fails its parent
        log.warning(
            "batch.error message=%s parent=%s error=%s", message.id, message.parent_id, error
        )
        try:
            outcome = "failed_parent" if batches.fail_batch(message, error) else "retry_scheduled"
        except Exception:  # noqa: BLE001 - the visibility timeout brings it back
            log.exception("batch.record_failed message=%s", message.id)
            outcome = "lost"
    log.info(
        "batch.%s message=%s parent=%s queue=%s batch=%d attempt=%d duration_ms=%d",
        outcome,
        message.id,
        message.parent_id,
        message.queue,
        message.batch_index,
        message.attempts,
        (time.monotonic() - started) * 1000,
    )
    return outcome


def extend_visibility(message_ids: list[int], seconds: float) -> None:
    if message_ids:
        BatchMessage.objects.filter(pk__in=message_ids).update(
            visible_after=db_now() + timedelta(seconds=seconds)
        )


def release_messages(message_ids: list[int]) -> None:
    """Make messages visible again at once (shutdown); the attempt is not counted.

    Graceful shutdowns so never use up a message's ``max_attempts``, which the
    claim enforces against consumers that die on it.
    """
    for message_id in message_ids:
        BatchMessage.objects.filter(pk=message_id, attempts__gt=0).update(
            visible_after=db_now(), attempts=F("attempts") - 1
        )
