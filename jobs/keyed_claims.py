"""The claim of keyed jobs: fair across keys, within every key's limits, on every worker at once.

One transaction per claim, on one queue:

1. **Window.** The queue's ready keyed jobs in turn order (``fair_turn``,
   given at enqueue by ``jobs.fair_turns``), ``window_size(limit, factor)`` of them
   (``_WindowFactors``: as many as the claim may start, more while keys are full):
   each is a turn for its fair key, locked ``FOR UPDATE SKIP LOCKED`` as it is
   read, so claimers at once take different turns. Keys already at their
   limit are left out of it (on PostgreSQL in a second look, taken only when
   the first one's turns went to such keys past what the claim could spare).
   Each key's turns go to its best jobs by priority (then turn), locked the
   same way.
2. **Keys.** The limited keys those jobs carry (``jobs.key_limits``) are
   locked, ``FOR UPDATE SKIP LOCKED`` on their ``FlowKey`` rows (made on
   first use). A key another claimer holds is skipped this round: nobody
   waits on a key, so claimers never deadlock on them.
3. **Counts.** The running jobs of those keys, counted by a *new* statement
   after the locks: its snapshot sees every claim that held a key before
   us, so two claimers can never both see room for the same last slot.
4. **Admission**, round-robin over the keys in turn order: a job starts when
   every one of its limited keys has room (``concurrency``) and a whole
   token (``rate``), and the claim's ``limit`` is not reached.
5. **Writes.** Buckets spent, turns handed over (a key's best job ran on the
   turn of an earlier one of lower priority: that job takes the later turn,
   so priority reorders a key's jobs without taking turns from other keys),
   and the admitted jobs started with their ``job.started`` events, as
   ``jobs.claims`` starts any job.

PostgreSQL: steps 1 to 4 and the writes to keys and turns are one function,
``controlplane_keyed_pick`` (migration 0020), called inside the statement
that starts the jobs (``keyed_pick``, ``jobs.claims.complete_and_claim``): a
worker's cycle completes its jobs and starts keyed ones in one statement.
The function's statements each take a new snapshot, as step 3 needs.

SQLite: the same steps here, in Python, under its IMMEDIATE transaction,
which lets one claimer in at a time (no row locks to take).
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from jobs.claims import (
    ClaimedJob,
    PickAfter,
    Runner,
    complete_and_claim,
    operation_conditions,
    room_under_cap,
    start_picked,
    this_process,
)
from jobs.dialect import dialect
from jobs.key_limits import Limits, cache, limits_for
from jobs.models import FlowKey
from jobs.rate_limits import refill, seconds_until_token
from jobs.tables import FLOW_KEY_TABLE, JOB_TABLE

_EPSILON = 1e-9
MAX_WINDOW = 1000
MIN_WINDOW = 16
MAX_WINDOW_FACTOR = 4
# A claim that started fewer jobs than it may because keys were at their limit or
# held by another claimer: try again after this long, doubling while claims keep
# coming up short, up to MAX_SHORT_RETRY_SECONDS. Those keys free up when jobs end
# on any worker, which wakes nobody here: without it, a worker left with no job
# slept to its next poll (2 s gaps in a drain of 7 s, bench/flow_keys.py).
SHORT_RETRY_SECONDS = 0.01
MAX_SHORT_RETRY_SECONDS = 0.5


class _WindowFactors:
    """How many turns a claim looks at, per (database, queue), as a multiple of its limit.

    Every turn in the window costs a locked job row and a locked key row, so a
    claim looks at no more turns than it may start (factor 1) while the keys it
    meets have room. A claim whose window was full but started fewer jobs than
    it may (keys at their limit, out of tokens, or held by another claimer)
    doubles the factor, up to ``MAX_WINDOW_FACTOR``: room past the keys that
    cannot start; a claim that filled up halves it again. In-process, 20,000
    jobs over 1,000 keys of limit 1: a claim of 32 took 6.5 ms with a window of
    128 turns, 4.4 ms with 32 (bench/README.md, flow keys).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._factors: dict[tuple[str, str], int] = {}
        self._misses: dict[tuple[str, str], int] = {}  # short claims in a row

    def size(self, using: str, queue: str, limit: int) -> int:
        with self._lock:
            factor = self._factors.get((using, queue), 1)
        return window_size(limit, factor)

    def learn(self, using: str, queue: str, *, short: bool, filled: bool) -> None:
        with self._lock:
            factor = self._factors.get((using, queue), 1)
            if short:
                factor = min(MAX_WINDOW_FACTOR, factor * 2)
            elif filled:
                factor = max(1, factor // 2)
            self._factors[(using, queue)] = factor

    def retry_after_short(self, using: str, queue: str, *, held_back: bool) -> float | None:
        """When to claim again after a claim that ``held_back`` jobs (keys full or held)."""
        with self._lock:
            misses = self._misses.get((using, queue), 0) + 1 if held_back else 0
            self._misses[(using, queue)] = misses
        if not misses:
            return None
        return min(MAX_SHORT_RETRY_SECONDS, SHORT_RETRY_SECONDS * 2 ** min(misses - 1, 16))


_windows = _WindowFactors()


def window_size(limit: int, factor: int = MAX_WINDOW_FACTOR) -> int:
    """How many turns a claim of ``limit`` jobs looks at (``factor`` times its limit)."""
    return min(MAX_WINDOW, max(MIN_WINDOW, factor * limit))


@dataclass(frozen=True)
class KeyedClaim:
    """What a keyed claim started, and when to try again if a key held a job back.

    ``retry_in``: a key's next token, or ``SHORT_RETRY_SECONDS`` (doubling)
    when keys at their limit or held by another claimer kept jobs back.
    """

    jobs: list[ClaimedJob]
    retry_in: float | None = None


@dataclass
class _Candidate:
    id: Any  # as the database reads it back (dialect-specific)
    keys: list[str]
    turn: float


@dataclass
class _Lane:
    """One fair key's turns in the window, and its best jobs to give them to."""

    key: str
    turns: list[tuple[Any, float]] = field(default_factory=list)  # (id, turn) in turn order
    best: list[_Candidate] = field(default_factory=list)  # priority order


def claim_keyed(
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
) -> KeyedClaim:
    """Claim and start up to ``limit`` keyed jobs of ``queue`` (steps in the module's docstring).

    ``cap`` is the queue's concurrency cap, counted with its unkeyed jobs.
    """
    if limit <= 0 or (operations is not None and not operations):
        return KeyedClaim([])
    d = dialect(using)
    if d.postgres:
        return _claim_keyed_postgres(
            queue=queue,
            worker_id=worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            operations=operations,
            local_operations=local_operations,
            cap=cap,
            runner=runner,
            using=using,
        )
    runner = runner or this_process()
    limits = cache.rows(using)
    # No savepoint inside a caller's transaction: a failure here fails the caller's
    # transaction as a whole.
    scope = transaction.atomic(using=using, savepoint=False)
    with scope, connections[using].cursor() as cursor:
        if cap is not None:
            limit = min(limit, room_under_cap(cursor, d, queue, cap))
            if limit <= 0:
                return KeyedClaim([])
        now = timezone.now()
        size = _windows.size(using, queue, limit)
        window = _window(cursor, d, queue, size, now, operations, local_operations, limits)
        lanes = window.lanes
        found = {"asked": limit, "turns": window.turns, "full_keys": window.full_keys}
        if not lanes:
            # Turns without a job to give them to: another claimer holds those jobs.
            held_back = window.turns > 0
            return KeyedClaim([], settle(using, queue, size, {**found, "held_back": held_back}))
        keys = {k for lane in lanes for c in lane.best for k in c.keys}
        limited = sorted(k for k in keys if limits_for(k, limits).limited)
        held = _lock_keys(cursor, d, limited) if limited else {}
        running = _running(cursor, d, [k for k in held if limits_for(k, limits).concurrency])
        admission = _Admission(limits, held, running, now)
        admitted = admission.run(lanes, limit)
        retry_in = settle(
            using,
            queue,
            size,
            {
                **found,
                "started": len(admitted),
                "held_back": admission.held_back,
                "retry_in": admission.retry_in,
            },
        )
        if not admitted:
            return KeyedClaim([], retry_in)
        _spend_tokens(cursor, d, admission)
        _hand_over_turns(cursor, d, lanes, {c.id for c in admitted})
        ids = [c.id for c in admitted]
        jobs = start_picked(
            cursor,
            d,
            pick=f"SELECT id FROM {JOB_TABLE} WHERE id IN {d.in_list(len(ids))}",
            pick_params=list(ids),
            worker_id=worker_id,
            now=now,
            lease_seconds=lease_seconds,
            runner=runner,
        )
    return KeyedClaim(jobs, retry_in)


def _claim_keyed_postgres(
    *,
    queue: str,
    worker_id: uuid.UUID,
    limit: int,
    lease_seconds: float,
    operations: Sequence[str] | None,
    local_operations: Collection[str] | None,
    cap: int | None,
    runner: Runner | None,
    using: str,
) -> KeyedClaim:
    """One statement (``controlplane_keyed_pick`` and the start), after the cap's count if any."""
    scope = transaction.atomic(using=using) if cap is not None else nullcontext()
    with scope:
        if cap is not None:
            with connections[using].cursor() as cursor:
                limit = min(limit, room_under_cap(cursor, dialect(using), queue, cap))
            if limit <= 0:
                return KeyedClaim([])
        pick = keyed_pick(
            queue,
            limit=limit,
            operations=operations,
            local_operations=local_operations,
            using=using,
        )
        _, jobs = complete_and_claim(
            [],
            queues=[],
            worker_id=worker_id,
            limit=limit,
            lease_seconds=lease_seconds,
            after=[pick],
            runner=runner,
            using=using,
        )
    return KeyedClaim(jobs, settled(pick))


@dataclass(kw_only=True)
class KeyedPick(PickAfter):
    """A keyed pick of one queue, for ``complete_and_claim`` (PostgreSQL)."""

    queue: str
    size: int  # its window's turns
    using: str


def keyed_pick(
    queue: str,
    *,
    limit: int,
    operations: Sequence[str] | None = None,
    local_operations: Collection[str] | None = None,
    using: str = "default",
) -> KeyedPick:
    """The keyed claim of ``queue`` as a pick of ``complete_and_claim``'s statement (PostgreSQL).

    ``controlplane_keyed_pick`` (migration 0020) runs the module's steps; after
    the statement, ``settled`` says when to try again.
    """
    limits = cache.rows(using)
    named = sorted(limits)
    size = _windows.size(using, queue, limit)
    return KeyedPick(
        "SELECT * FROM controlplane_keyed_pick({wanted}, {ending}, %s, statement_timestamp(), "
        "%s, %s, "
        "%s::text[], %s::text[], %s::text[], %s::int[], %s::float8[], %s::float8[])",
        [
            queue,
            size,
            scan_size(size),
            None if operations is None else list(operations),
            None if local_operations is None else list(local_operations),
            named,
            [limits[n].concurrency for n in named],
            [limits[n].rate for n in named],
            [limits[n].burst for n in named],
        ],
        queue=queue,
        size=size,
        using=using,
    )


def settled(pick: KeyedPick) -> float | None:
    """When to claim the pick's queue again, its window factor learnt (``settle``)."""
    if pick.found is None:
        return None
    return settle(pick.using, pick.queue, pick.size, pick.found)


def settle(using: str, queue: str, size: int, found: dict[str, Any]) -> float | None:
    """Learn the window's factor from a claim; when to claim again, if a key held jobs back.

    ``found``: what the claim wanted (``asked``) and started, the turns its
    window held, the keys already at their limit (``full_keys``), whether a
    key at its limit or held by another claimer kept a job back
    (``held_back``), and a key's next token (``retry_in``).
    """
    asked, started = found["asked"], found.get("started", 0)
    if asked <= 0:
        return None
    _windows.learn(
        using,
        queue,
        short=found["turns"] >= size and started < asked,
        filled=started >= asked,
    )
    retry_in = found.get("retry_in")
    short_retry = _windows.retry_after_short(
        using, queue, held_back=(found["held_back"] or found["full_keys"] > 0) and started < asked
    )
    if short_retry is not None:
        retry_in = short_retry if retry_in is None else min(retry_in, short_retry)
    return retry_in


# --- 1. the window ------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    refilled_at: datetime | None


@dataclass
class _Window:
    lanes: list[_Lane]
    turns: int  # turns in the window, with or without a job to give them to
    # Keys at their concurrency limit whose jobs the window left out (they free up when
    # a job ends on any worker, which wakes nobody: a claim that came up short retries).
    full_keys: int = 0


def _window(
    cursor: Any,
    d: Any,
    queue: str,
    size: int,
    now: datetime,
    operations: Sequence[str] | None,
    local_operations: Collection[str] | None,
    limits: dict[str, Limits],
) -> _Window:
    """SQLite: the window's lanes in turn order, each with its best jobs."""
    now_sql, now_params = d.now(at=now)
    filters = [("queue = %s", [queue]), (f"run_after <= {now_sql}", now_params)]
    filters += operation_conditions(d, operations, local_operations)
    where = " AND ".join(["status = 'queued'", "fair_turn IS NOT NULL", *(f for f, _ in filters)])
    where_params = [p for _, ps in filters for p in ps]
    lanes: dict[str, _Lane] = {}
    blocked = _full_keys(cursor, limits)
    unblocked, unblocked_params = "1 = 1", []
    if blocked:
        listed = d.in_list(len(blocked))
        unblocked = f"NOT EXISTS (SELECT 1 FROM json_each(flow_keys) WHERE value IN {listed})"
        unblocked_params = blocked
    cursor.execute(
        f"SELECT id, fair_key, fair_turn FROM (SELECT id, fair_key, fair_turn, flow_keys "
        f"FROM {JOB_TABLE} WHERE {where} ORDER BY fair_turn LIMIT %s) WHERE {unblocked} "
        "ORDER BY fair_turn LIMIT %s",
        [*where_params, scan_size(size), *unblocked_params, size],
    )
    rows = cursor.fetchall()
    for job_id, key, turn in rows:
        lanes.setdefault(key, _Lane(key)).turns.append((job_id, turn))
    for lane in lanes.values():
        cursor.execute(
            f"SELECT id, fair_turn, flow_keys FROM {JOB_TABLE} WHERE {where} AND fair_key = %s "
            f"AND {unblocked} ORDER BY priority DESC, fair_turn LIMIT %s",
            [*where_params, lane.key, *unblocked_params, len(lane.turns)],
        )
        lane.best = [_Candidate(r[0], d.read_json(r[2]), r[1]) for r in cursor.fetchall()]
    return _Window(list(lanes.values()), turns=len(rows), full_keys=len(blocked))


# The most turns a window reads past keys at their limit to find turns it can start.
MAX_SCAN = 5000


def scan_size(size: int) -> int:
    """How many turns a window of ``size`` may read, skipping keys already at their limit."""
    return max(size, min(MAX_SCAN, 20 * size))


def _full_keys(cursor: Any, limits: dict[str, Limits]) -> list[str]:
    """SQLite: the keys of running jobs that are at their concurrency limit."""
    if not any(lim.concurrency is not None for lim in limits.values()):
        return []
    cursor.execute(
        f"SELECT k.value, count(*) FROM {JOB_TABLE} j, json_each(j.flow_keys) k "
        "WHERE j.status = 'running' AND j.fair_key IS NOT NULL GROUP BY k.value"
    )
    full = []
    for key, running in cursor.fetchall():
        concurrency = limits_for(key, limits).concurrency
        if concurrency is not None and running >= concurrency:
            full.append(key)
    return full


# --- 2. and 3. the keys and their counts ---------------------------------------------


def _lock_keys(cursor: Any, d: Any, keys: list[str]) -> dict[str, _Bucket]:
    """SQLite: make the keys' rows on first use.

    Its IMMEDIATE transaction already keeps other claimers out: every key is held.
    """
    stamp = d.ts(timezone.now())
    cursor.executemany(
        f"INSERT INTO {FLOW_KEY_TABLE} (key, tokens, refilled_at, created_at) "
        "VALUES (%s, 0, NULL, %s) ON CONFLICT DO NOTHING",
        [(k, stamp) for k in keys],
    )
    rows = FlowKey.objects.using(cursor.db.alias).filter(key__in=keys)
    return {r.key: _Bucket(r.tokens, r.refilled_at) for r in rows}


def _running(cursor: Any, d: Any, keys: list[str]) -> dict[str, int]:
    """How many jobs of each key run now (a new statement: it sees every earlier claim)."""
    if not keys:
        return {}
    cursor.execute(
        f"SELECT k.value, count(*) FROM {JOB_TABLE} j, json_each(j.flow_keys) k "
        "WHERE j.status = 'running' AND j.fair_key IS NOT NULL "
        f"AND k.value IN {d.in_list(len(keys))} GROUP BY k.value",
        keys,
    )
    return dict(cursor.fetchall())


# --- 4. admission -------------------------------------------------------------------


class _Admission:
    """Which candidates start: every limited key with room and a token, in turn order."""

    def __init__(
        self,
        limits: dict[str, Limits],
        held: dict[str, _Bucket],
        running: dict[str, int],
        now: datetime,
    ) -> None:
        self.limits = limits
        self.held = held
        self.now = now
        self.room: dict[str, int] = {}
        self.tokens: dict[str, float] = {}
        self.stamps: dict[str, datetime] = {}
        for key, bucket in held.items():
            lim = limits_for(key, limits)
            if lim.concurrency is not None:
                self.room[key] = lim.concurrency - running.get(key, 0)
            if lim.rate is not None:
                tokens, stamp = refill(
                    bucket.tokens, bucket.refilled_at, rate=lim.rate, now=now, capacity=lim.bucket
                )
                self.tokens[key], self.stamps[key] = tokens, stamp
        self.spent: set[str] = set()
        self.retry_in: float | None = None
        self.held_back = False  # a key at its limit or held by another claimer kept a job

    def _fits(self, keys: list[str]) -> bool:
        for key in keys:
            lim = limits_for(key, self.limits)
            if not lim.limited:
                continue
            if key not in self.held:
                self.held_back = True
                return False  # another claimer holds it now
            if lim.concurrency is not None and self.room[key] <= 0:
                self.held_back = True
                return False
            if lim.rate is not None and self.tokens[key] < 1 - _EPSILON:
                wait = seconds_until_token(self.tokens[key], rate=lim.rate)
                self.retry_in = wait if self.retry_in is None else min(self.retry_in, wait)
                return False
        return True

    def _take(self, keys: list[str]) -> None:
        for key in keys:
            if key in self.room:
                self.room[key] -= 1
            if key in self.tokens:
                self.tokens[key] -= 1
                self.spent.add(key)

    def run(self, lanes: list[_Lane], limit: int) -> list[_Candidate]:
        admitted: list[_Candidate] = []
        # Round-robin over the lanes, one turn each per round, until the turns run out.
        taken: defaultdict[str, int] = defaultdict(int)
        pending = {lane.key: list(lane.best) for lane in lanes}
        rounds = max((len(lane.turns) for lane in lanes), default=0)
        for turn in range(rounds):
            for lane in lanes:
                if len(admitted) >= limit:
                    return admitted
                if turn >= len(lane.turns) or taken[lane.key] > turn:
                    continue
                queue = pending[lane.key]
                for i, candidate in enumerate(queue):
                    if self._fits(candidate.keys):
                        self._take(candidate.keys)
                        admitted.append(queue.pop(i))
                        taken[lane.key] += 1
                        break
        return admitted


# --- 5. the writes ------------------------------------------------------------------


def _spend_tokens(cursor: Any, d: Any, admission: _Admission) -> None:
    keys = sorted(admission.spent)
    if not keys:
        return
    cursor.executemany(
        f"UPDATE {FLOW_KEY_TABLE} SET tokens = %s, refilled_at = %s WHERE key = %s",
        [(max(0.0, admission.tokens[k]), d.ts(admission.stamps[k]), k) for k in keys],
    )


def _hand_over_turns(cursor: Any, d: Any, lanes: list[_Lane], started: set[Any]) -> None:
    """A key's started jobs take its earliest turns; the jobs that held those take theirs.

    Only when priority picked a job from further back in its key: otherwise
    the started jobs held those turns already and nothing is written.
    """
    moves: list[tuple[Any, float]] = []
    for lane in lanes:
        ran = [c for c in lane.best if c.id in started]
        if not ran:
            continue
        earliest = lane.turns[: len(ran)]
        earliest_ids = {job_id for job_id, _ in earliest}
        later_turns = sorted(c.turn for c in ran if c.id not in earliest_ids)
        holders = [job_id for job_id, _ in earliest if job_id not in started]
        moves += list(zip(holders, later_turns, strict=True))
    if not moves:
        return
    cursor.executemany(
        f"UPDATE {JOB_TABLE} SET fair_turn = %s WHERE id = %s AND status = 'queued'",
        [(turn, job_id) for job_id, turn in moves],
    )
