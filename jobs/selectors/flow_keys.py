"""Which flow keys hold jobs back now, and why one queued job is not starting.

The reads behind the queues page's "keys holding jobs back", the job page's
waiting reasons and the ``controlplane_key_held_back_jobs`` /
``controlplane_keys_at_limit`` gauges. They judge a key as the keyed claim
does (``jobs.keyed_claims``): its limits are ``jobs.key_limits``' cached
rows (``limits_for``), its running jobs are the keyed jobs running now whose
``flow_keys`` hold it, and its bucket is its ``FlowKey`` row refilled
(``jobs.rate_limits.refill``) at the database's time (``jobs.clock.db_now``).

A key *holds jobs back* when it is **at its limit** (as many of its jobs
run as its ``concurrency``) or **out of tokens** (its ``rate`` bucket holds
less than one) and ready queued jobs of the queue carry it. What is read
stays bounded by activity, not by backlog or tenants:

- candidate keys are those carried by running keyed jobs (the running rows
  only, on ``job_running_keyed_idx``) and those whose bucket was spent in
  the last ``1 / rate`` seconds (a bucket refilled longer ago than that holds
  a whole token again), at most ``MAX_CANDIDATES`` of each;
- per queue, the ready keyed jobs are scanned in turn order (``job_fair_turn_idx``)
  up to ``COUNT_CAP`` rows: a key's earliest turns are its oldest jobs, so its
  oldest waiting job is within them; counts past the cap say so (``capped``).

Reads go to ``using``, by default the scope's read alias (``jobs.replica``:
the read replica inside a dashboard page or a scrape, else the primary).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections

from jobs.clock import db_now
from jobs.conf import knob
from jobs.dialect import Dialect, dialect
from jobs.flow_keys import family
from jobs.key_limits import Limits, cache, limits_for
from jobs.models import FlowKey, Job, Queue
from jobs.rate_limits import refill
from jobs.replica import read_alias
from jobs.states import QUEUED, RUNNING
from jobs.tables import JOB_TABLE

# Most keys of each kind (running, recently spent) considered in one read.
MAX_CANDIDATES = 5000
# Most keyed queues one read covers (as many as /metrics exports).
MAX_QUEUES = 1000
_EPSILON = 1e-9


@dataclass(frozen=True)
class KeyState:
    """One key's standing against its limits now."""

    key: str
    limits: Limits
    running: int = 0
    tokens: float | None = None  # None: no rate

    @property
    def at_limit(self) -> bool:
        return self.limits.concurrency is not None and self.running >= self.limits.concurrency

    @property
    def out_of_tokens(self) -> bool:
        return self.tokens is not None and self.tokens < 1 - _EPSILON

    @property
    def holding(self) -> bool:
        return self.at_limit or self.out_of_tokens

    def reasons(self, *, rate_word: str = "") -> list[str]:
        """What holds the key's jobs back: ``at its limit 2/2``, ``out of tokens (10/s)``."""
        out = []
        if self.at_limit:
            out.append(f"at its limit {self.running}/{self.limits.concurrency}")
        if self.out_of_tokens and self.limits.rate is not None:
            out.append(f"out of tokens ({rate_word}{self.limits.rate:g}/s)")
        return out


@dataclass(frozen=True)
class HeldKey:
    """A key holding back ready jobs of one queue, and the oldest of them."""

    queue: str
    key: str
    reason: str  # "at its limit 2/2", "out of tokens (10/s)", or both joined by " and "
    at_limit: bool
    out_of_tokens: bool
    held: int  # ready queued jobs of the queue carrying the key (within the scan)
    oldest_id: uuid.UUID
    oldest_age: float  # seconds since the oldest of them became ready

    @property
    def family(self) -> str:
        return family(self.key)


@dataclass(frozen=True)
class QueueHeldBack:
    """A keyed queue's keys holding jobs back, most held first (``top`` of them)."""

    queue: str
    keys: list[HeldKey] = field(default_factory=list)
    total: int = 0  # ready jobs held back by at least one key
    key_count: int = 0  # keys holding jobs back (``keys`` may show fewer)
    capped: bool = False  # the scan stopped at COUNT_CAP ready keyed jobs: counts are floors
    all_keys: list[HeldKey] = field(default_factory=list, repr=False)  # every one, for /metrics


def held_back(
    queue: str | None = None, *, top: int | None = 20, using: str | None = None
) -> dict[str, QueueHeldBack]:
    """Per keyed queue (or just ``queue``), the keys holding ready jobs back now.

    Every keyed queue (``Queue.keyed``) has an entry, empty when nothing is
    held; ``keys`` holds the ``top`` keys by jobs held (None: all of them).
    """
    using = using or read_alias()
    names = _keyed_queues(queue, using)
    if not names:
        return {}
    rows = cache.rows(using)
    now = db_now(using)
    holding = {s.key: s for s in _candidate_states(rows, now, using) if s.holding}
    out = {}
    for name in names:
        found = _scan(name, holding, now, using) if holding else QueueHeldBack(name)
        keys = found.all_keys if top is None else found.all_keys[:top]
        out[name] = QueueHeldBack(
            name, keys, found.total, len(found.all_keys), found.capped, found.all_keys
        )
    return out


def held_back_by_family(using: str | None = None) -> dict[tuple[str, str], tuple[int, int]]:
    """(queue, family) -> (jobs held back, keys holding them), for every keyed queue.

    A job held back by keys of two families counts in each. Families that
    have limits but hold nothing back read (0, 0), so series do not vanish.
    """
    using = using or read_alias()
    queues = held_back(top=None, using=using)
    limited = sorted({family(name) for name, lim in cache.rows(using).items() if lim.limited})
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for name, entry in queues.items():
        for fam in limited:
            out[(name, fam)] = (0, 0)
        for held in entry.all_keys:
            jobs, keys = out.get((name, held.family), (0, 0))
            out[(name, held.family)] = (jobs + held.held, keys + 1)
    return out


def waiting_reason(job: Any, *, using: str | None = None) -> list[str]:
    """Why a queued, due job is not starting, as sentences; empty when nothing holds it.

    The queue's own limits first (paused, at its cap, out of its rate's
    tokens), then each of the job's keys at its limit or out of tokens. A job
    not due yet, or not queued, gets none: time holds it (its badge says so).
    """
    if getattr(job, "status", None) != QUEUED:
        return []
    using = using or read_alias()
    now = db_now(using)
    if job.run_after is not None and job.run_after > now:
        return []
    reasons = _queue_reasons(job.queue, now, using)
    keys = [k for k in (job.flow_keys or []) if isinstance(k, str)]
    if keys:
        rows = cache.rows(using)
        for state in key_states(keys, rows, now, using):
            reasons += [f"key {state.key} {r}" for r in state.reasons(rate_word="rate ")]
    return reasons


def key_states(
    keys: Sequence[str],
    rows: Mapping[str, Limits],
    now: datetime,
    using: str | None = None,
    *,
    running: Mapping[str, int] | None = None,
) -> list[KeyState]:
    """The limited ones of ``keys`` with their running jobs and tokens now, in the given order.

    ``running`` gives the counts when the caller read them already.
    """
    using = using or read_alias()
    limited = {k: limits_for(k, rows) for k in dict.fromkeys(keys)}
    limited = {k: lim for k, lim in limited.items() if lim.limited}
    if not limited:
        return []
    if running is None:
        running = running_counts([k for k, lim in limited.items() if lim.concurrency], using)
    rated = [k for k, lim in limited.items() if lim.rate is not None]
    # A key without a row was never spent: its bucket is full.
    buckets = {r.key: r for r in FlowKey.objects.using(using).filter(key__in=rated)}
    states = []
    for key, lim in limited.items():
        tokens = None
        if lim.rate is not None:
            bucket = buckets.get(key)
            tokens = (
                refill(
                    bucket.tokens, bucket.refilled_at, rate=lim.rate, now=now, capacity=lim.bucket
                )[0]
                if bucket is not None
                else lim.bucket
            )
        states.append(KeyState(key, lim, running.get(key, 0), tokens))
    return states


def running_counts(keys: Iterable[str] | None, using: str | None = None) -> dict[str, int]:
    """Running keyed jobs per key: of ``keys``, or of every key (None; ``MAX_CANDIDATES`` most)."""
    wanted = None if keys is None else sorted(set(keys))
    if wanted is not None and not wanted:
        return {}
    using = using or read_alias()
    d = dialect(using)
    where = f"j.status = '{RUNNING}' AND j.fair_key IS NOT NULL"
    params: list[Any] = []
    if d.postgres:
        if wanted is not None:
            where += " AND k.key = ANY(%s::text[])"
            params.append(wanted)
        sql = (
            f"SELECT k.key, count(*) FROM {JOB_TABLE} j "
            "CROSS JOIN LATERAL jsonb_array_elements_text(j.flow_keys) AS k(key) "
            f"WHERE {where} GROUP BY k.key ORDER BY count(*) DESC LIMIT %s"
        )
    else:
        if wanted is not None:
            where += f" AND k.value IN {d.in_list(len(wanted))}"
            params += wanted
        sql = (
            f"SELECT k.value, count(*) FROM {JOB_TABLE} j, json_each(j.flow_keys) k "
            f"WHERE {where} GROUP BY k.value ORDER BY count(*) DESC LIMIT %s"
        )
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*params, MAX_CANDIDATES])
        return {key: int(n) for key, n in cursor.fetchall()}


# --- the pieces ---------------------------------------------------------------------


def _keyed_queues(queue: str | None, using: str) -> list[str]:
    rows = Queue.objects.using(using).filter(keyed=True)
    if queue is not None:
        rows = rows.filter(name=queue)
    return list(rows.order_by("name").values_list("name", flat=True)[:MAX_QUEUES])


def _candidate_states(rows: Mapping[str, Limits], now: datetime, using: str) -> list[KeyState]:
    """Keys that may hold jobs back: those running keyed jobs carry, those spent lately."""
    if not any(lim.limited for lim in rows.values()):
        return []
    running = running_counts(None, using)
    keys = dict.fromkeys(running)
    rates = [lim.rate for lim in rows.values() if lim.rate]
    if rates:
        # A bucket refilled more than 1 / rate ago holds a whole token again.
        since = now - timedelta(seconds=1.0 / min(rates))
        spent = (
            FlowKey.objects.using(using)
            .filter(refilled_at__gt=since)
            .order_by("-refilled_at")
            .values_list("key", flat=True)[:MAX_CANDIDATES]
        )
        keys.update(dict.fromkeys(spent))
    return key_states(list(keys), rows, now, using, running=running)


def _queue_reasons(name: str, now: datetime, using: str) -> list[str]:
    """The queue's own limits that stop its claims now: paused, at its cap, out of tokens."""
    q = Queue.objects.using(using).filter(name=name).first()
    if q is None:
        return []
    reasons = []
    if q.paused:
        reasons.append("queue paused")
    if q.concurrency_cap is not None:
        # The running jobs of one queue: as many as its workers' slots, on (queue, status).
        running = Job.objects.using(using).filter(queue=name, status=RUNNING).order_by().count()
        if running >= q.concurrency_cap:
            reasons.append(f"queue at its cap {running}/{q.concurrency_cap}")
    if q.rate_limit_per_second:
        tokens, _ = refill(q.rate_tokens, q.rate_refilled_at, rate=q.rate_limit_per_second, now=now)
        if tokens < 1 - _EPSILON:
            reasons.append(f"queue out of tokens (rate {q.rate_limit_per_second:g}/s)")
    return reasons


def _scan(name: str, holding: Mapping[str, KeyState], now: datetime, using: str) -> QueueHeldBack:
    """The queue's ready keyed jobs (up to COUNT_CAP, in turn order) that holding keys carry."""
    d = dialect(using)
    cap = int(knob("COUNT_CAP"))
    keys = sorted(holding)
    sql, params = _scan_sql(d, name, keys, now, cap)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    total = scanned = 0
    found = []
    for kind, key, n, job_id, run_after in rows:
        if kind == 1:
            total = int(n)
            continue
        if kind == 2:
            scanned = int(n)
            continue
        state = holding[key]
        ready_at = d.read_ts(run_after) or now
        if ready_at.tzinfo is None:  # SQLite hands a raw read back naive, in UTC
            ready_at = ready_at.replace(tzinfo=UTC)
        found.append(
            HeldKey(
                queue=name,
                key=key,
                reason=" and ".join(state.reasons()),
                at_limit=state.at_limit,
                out_of_tokens=state.out_of_tokens,
                held=int(n),
                oldest_id=d.read_id(job_id),
                oldest_age=round(max(0.0, (now - ready_at).total_seconds()), 3),
            )
        )
    found.sort(key=lambda h: (-h.held, -h.oldest_age, h.key))
    return QueueHeldBack(name, found, total, len(found), scanned > cap, found)


def _scan_sql(
    d: Dialect, name: str, keys: list[str], now: datetime, cap: int
) -> tuple[str, list[Any]]:
    """One statement: per holding key its ready jobs and its oldest; the jobs held; the scan's size.

    Rows are ``(kind, key, n, id, run_after)``: kind 0 a key, 1 the jobs held
    back by any key, 2 how many rows the scan read (``cap + 1``: it stopped).
    """
    scan = (
        f"SELECT id, flow_keys, run_after, created_at FROM {JOB_TABLE} "
        f"WHERE status = '{QUEUED}' AND fair_turn IS NOT NULL AND queue = %s "
        "AND run_after <= %s ORDER BY fair_turn LIMIT %s"
    )
    if d.postgres:
        hits = (
            "SELECT s.id, s.run_after, s.created_at, k.key FROM scan s "
            "CROSS JOIN LATERAL jsonb_array_elements_text(s.flow_keys) AS k(key) "
            "JOIN unnest(%s::text[]) AS h(key) ON h.key = k.key"
        )
        key_params: list[Any] = [keys]
    else:
        hits = (
            "SELECT s.id, s.run_after, s.created_at, k.value AS key FROM scan s, "
            f"json_each(s.flow_keys) k WHERE k.value IN {d.in_list(len(keys))}"
        )
        key_params = list(keys)
    sql = (
        f"WITH scan AS ({scan}), hits AS ({hits}), "
        "ranked AS (SELECT key, id, run_after, count(*) OVER (PARTITION BY key) AS n, "
        "row_number() OVER (PARTITION BY key ORDER BY run_after, created_at, id) AS rn "
        "FROM hits) "
        "SELECT 0, key, n, id, run_after FROM ranked WHERE rn = 1 "
        "UNION ALL SELECT 1, NULL, count(DISTINCT id), NULL, NULL FROM hits "
        "UNION ALL SELECT 2, NULL, count(*), NULL, NULL FROM scan"
    )
    return sql, [name, d.ts(now), cap + 1, *key_params]
