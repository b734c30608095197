"""Per-queue rate limits: a token bucket on the queue's row, spent by the claim that starts jobs.

A queue with ``rate_limit_per_second`` (``r``) starts at most ``r`` jobs a
second across every worker, local and remote: the bucket lives in the
database (``Queue.rate_tokens``, ``Queue.rate_refilled_at``), and each claim
on the queue refills it, takes what it may and claims at most that many jobs
in one transaction under the queue row's lock (``SELECT … FOR UPDATE`` on
PostgreSQL; SQLite's IMMEDIATE transaction already lets one writer in at a
time). Tokens a claim took but found no job for go back in the same write.

The bucket refills at ``r`` tokens a second up to ``burst(r)`` = ``max(1, r)``:
after a quiet spell a queue may start one second's worth of jobs at once,
then ``r`` a second. Over any window of ``T`` seconds a queue starts at most
``burst + r × T`` jobs.

Claimers never poll an empty bucket: the claim says when its next token is
due (``RateLimitedClaim.retry_in``) and the process remembers it
(``TokenWaits``), skipping the queue without a query until then, whatever
wakes it meanwhile (a NOTIFY, a finished job).

Queues without a limit never come here: the callers' cached queue settings
already say so, and their claims cost what they always did.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from jobs.claims import ClaimedJob, Runner, claim_jobs
from jobs.clock import db_now
from jobs.models import Queue

# floor(0.9999999999) is a rounding error, not a missing token.
_EPSILON = 1e-9


# --- the bucket's arithmetic ----------------------------------------------------------


def burst(rate: float) -> float:
    """The most tokens a bucket holds: one second's worth, and at least one job."""
    return max(1.0, rate)


def refill(
    tokens: float,
    refilled_at: datetime | None,
    *,
    rate: float,
    now: datetime,
    capacity: float | None = None,
) -> tuple[float, datetime]:
    """The bucket's tokens at ``now`` and the stamp to store with them.

    A bucket never refilled starts full. Tokens grow by ``elapsed × rate`` up
    to ``capacity`` (default ``burst(rate)``; a flow key may set its own). A
    claimer whose clock is behind the stored stamp (a skewed host) adds
    nothing and keeps the stamp: skew can only slow a queue down, never let
    it past its limit.
    """
    full = burst(rate) if capacity is None else capacity
    if refilled_at is None:
        return full, now
    elapsed = (now - refilled_at).total_seconds()
    if elapsed <= 0:
        return min(tokens, full), refilled_at
    return min(full, tokens + elapsed * rate), now


def take(tokens: float, wanted: int) -> int:
    """How many jobs a claim that wants ``wanted`` may start: whole tokens only."""
    return max(0, min(wanted, math.floor(tokens + _EPSILON)))


def seconds_until_token(tokens: float, *, rate: float) -> float:
    """How long until the bucket holds one whole token again."""
    return max(0.0, (1.0 - tokens) / rate)


# --- the claim ----------------------------------------------------------------------


@dataclass(frozen=True)
class RateLimitedClaim:
    """What a claim on a rate-limited queue started, and when to try again.

    ``retry_in`` is set when the bucket stopped the claim (it wanted more
    than the tokens allowed): the seconds until the next token is due.
    None when the bucket did not stop it (the queue ran out of jobs, a
    concurrency cap was full): wait for the usual wake-ups then.
    """

    jobs: list[ClaimedJob]
    retry_in: float | None = None


def claim_rate_limited(
    *,
    queue: str,
    worker_id: uuid.UUID,
    limit: int,
    lease_seconds: float,
    operations: Sequence[str] | None = None,
    local_operations: Collection[str] | None = None,
    cap: int | None = None,
    runner: Runner | None = None,
    using: str = "default",
    claimer: Callable[[int], list[ClaimedJob]] | None = None,
) -> RateLimitedClaim:
    """``claim_jobs`` on one rate-limited queue, at most as many jobs as its bucket allows.

    One transaction: lock the queue row, refill, claim at most the whole
    tokens (``cap`` applies as well), store what is left. A queue whose limit
    was cleared since the caller read its settings is claimed unlimited.
    ``claimer(n)`` claims instead of ``claim_jobs`` (the keyed claim, which
    applies ``cap`` itself).
    """
    if limit <= 0:
        return RateLimitedClaim([])
    now = db_now(using)

    def claim(n: int) -> list[ClaimedJob]:
        if claimer is not None:
            return claimer(n)
        return claim_jobs(
            queues=[queue],
            worker_id=worker_id,
            limit=n,
            lease_seconds=lease_seconds,
            operations=operations,
            local_operations=local_operations,
            cap=cap,
            runner=runner,
            using=using,
        )

    with transaction.atomic(using=using):
        row = (
            Queue.objects.using(using)
            .select_for_update()  # a no-op on SQLite, whose IMMEDIATE transaction serialises us
            .filter(name=queue)
            .values_list("rate_limit_per_second", "rate_tokens", "rate_refilled_at")
            .first()
        )
        if row is None or row[0] is None:
            return RateLimitedClaim(claim(limit))
        rate = float(row[0])
        tokens, stamp = refill(row[1], row[2], rate=rate, now=now)
        granted = take(tokens, limit)
        if granted == 0:
            # Nothing stored: refilling later from the old stamp gives the same tokens.
            return RateLimitedClaim([], seconds_until_token(tokens, rate=rate))
        jobs = claim(granted)
        left = max(0.0, tokens - len(jobs))
        Queue.objects.using(using).filter(name=queue).update(
            rate_tokens=left, rate_refilled_at=stamp
        )
    stopped = granted < limit and len(jobs) == granted
    return RateLimitedClaim(jobs, seconds_until_token(left, rate=rate) if stopped else None)


# --- not asking before the next token is due ---------------------------------------


class TokenWaits:
    """Per process: until when each rate-limited queue's bucket is known to be empty.

    A claimer asks ``ready`` before claiming from a rate-limited queue and
    records ``hold`` after a claim the bucket stopped. A hold is forgotten
    when the queue's limit changes, so raising or clearing a limit is not
    held back by a wait computed for the old one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict[str, tuple[float, float]] = {}  # queue -> (monotonic deadline, rate)

    def hold(self, queue: str, *, rate: float, seconds: float) -> None:
        with self._lock:
            self._until[queue] = (time.monotonic() + seconds, rate)

    def ready(self, queue: str, *, rate: float) -> bool:
        """True when a claim may find a token (no hold, the hold is over, or the rate changed)."""
        with self._lock:
            held = self._until.get(queue)
            if held is None:
                return True
            if held[1] != rate or time.monotonic() >= held[0]:
                del self._until[queue]
                return True
            return False

    def seconds_left(self, queues: Iterable[str]) -> float | None:
        """Seconds until the first hold among ``queues`` ends; None when none is held."""
        now = time.monotonic()
        with self._lock:
            ends = [self._until[q][0] for q in queues if q in self._until]
        return max(0.0, min(ends) - now) if ends else None
