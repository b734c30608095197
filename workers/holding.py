"""A worker's ``pre_dequeue`` saying "not now": no claim for a while, and why, for operators.

``JobWorker.pre_dequeue`` may return ``NotNow(seconds, reason)`` instead of
a bool: the worker claims nothing for ``seconds`` (its main loop sleeps
until then, and still wakes at once for a shutdown), logs a
``worker.holding_off`` line, and records the end and the reason on its
``Worker`` row (``holding_until``, ``holding_reason``), which the
dashboard's workers page shows. The row is cleared once ``pre_dequeue``
answers anything else (``worker.holding_ended``).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from jobs.clock import db_now
from jobs.models import Worker

log = logging.getLogger("workers")

# The reason as stored and shown: a sentence, not a report.
MAX_REASON_CHARS = 500


@dataclass(frozen=True)
class NotNow:
    """``pre_dequeue``'s "not now": claim nothing for ``seconds``, because ``reason``."""

    seconds: float
    reason: str = ""

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"NotNow(seconds={seconds!r}): give a number of seconds.")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(
                f"NotNow(seconds={seconds!r}): give a number of seconds above 0 "
                "(return True to claim now)."
            )
        if not isinstance(self.reason, str):
            raise TypeError(f"NotNow(reason={self.reason!r}): give the reason as text.")


class HoldOff:
    """The worker's current hold, on its own monotonic clock, and its record on the row."""

    def __init__(self, worker_id: uuid.UUID) -> None:
        self.worker_id = worker_id
        self.until = 0.0  # time.monotonic() at which claiming may resume
        self.reason = ""
        self.recorded = False

    def active(self) -> bool:
        return time.monotonic() < self.until

    def seconds_left(self) -> float:
        """Seconds until the hold ends (``inf`` when there is none)."""
        left = self.until - time.monotonic()
        return left if left > 0 else math.inf

    def start(self, answer: NotNow) -> None:
        """Hold off for ``answer.seconds``; log it and record it on the worker's row."""
        self.until = time.monotonic() + answer.seconds
        self.reason = answer.reason.strip()[:MAX_REASON_CHARS]
        until = db_now() + timedelta(seconds=answer.seconds)
        log.info(
            "worker.holding_off id=%s seconds=%g until=%s reason=%r",
            self.worker_id,
            answer.seconds,
            until.strftime("%H:%M:%S"),
            self.reason,
        )
        self._record(holding_until=until, holding_reason=self.reason)
        self.recorded = True

    def end(self) -> None:
        """``pre_dequeue`` answered after the hold ran out: clear the row's record of it."""
        if not self.recorded:
            return
        self.recorded = False
        self.until = 0.0
        log.info("worker.holding_ended id=%s", self.worker_id)
        self._record(holding_until=None, holding_reason="")

    def _record(self, **fields: object) -> None:
        try:
            Worker.objects.filter(pk=self.worker_id).update(**fields)
        except Exception as error:  # noqa: BLE001 - the record is for operators; claiming goes on
            log.warning("worker.holding_record_failed id=%s error=%s", self.worker_id, error)
