"""Fair dispatch: each keyed job's turn in its queue, given when it is enqueued.

Start-time fair queuing. Every queue has a virtual time ``V``: the turn of
its oldest waiting keyed job (or, with none waiting, the last turn given).
Each ``(queue, fair key)`` lane remembers the next turn it has to give
(``FairLane.last_turn``). A new job of key ``k`` with weight ``w`` gets
``max(V, next turn of k)``, and the lane's next turn moves on by ``1/w``.
So a key that enqueued 50,000 jobs holds turns far ahead, and a key that
arrives later starts at ``V``, right beside the first key's next job: the
claim (``jobs.keyed_claims``), which starts keyed jobs in turn order, then
alternates between them; a key never waits more than one turn per other
waiting key. Priority orders jobs within a key: a claim gives a key's turn
to its best job (``jobs.keyed_claims``).

The lane's row is upserted in the enqueue's transaction, so concurrent
enqueues of one key take turns one after the other. Unkeyed jobs never come
here and cost nothing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.utils import timezone

from jobs.dialect import dialect
from jobs.key_limits import cache, limits_for
from jobs.models import Queue
from jobs.tables import FAIR_LANE_TABLE, JOB_TABLE

_keyed_queues: set[str] = set()
_keyed_lock = threading.Lock()


def assign_turns(rows: Sequence[Any], using: str = "default") -> None:
    """Set ``fair_turn`` on each row with a ``fair_key``; call in the enqueue's transaction."""
    by_queue: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.fair_key is not None:
            by_queue[row.queue][row.fair_key].append(row)
    if not by_queue:
        return
    d = dialect(using)
    limits = cache.rows(using)
    with connections[using].cursor() as cursor:
        for queue, lanes in by_queue.items():
            _mark_keyed(queue, using)
            steps = {key: 1.0 / limits_for(key, limits).weight for key in lanes}
            spans = {key: steps[key] * len(jobs) for key, jobs in lanes.items()}
            ends = _advance_lanes(cursor, d, queue, spans)
            for key, jobs in lanes.items():
                start = ends[key] - spans[key]
                for i, row in enumerate(jobs):
                    row.fair_turn = start + i * steps[key]


def _virtual_time(queue_param: str) -> str:
    """SQL for a queue's virtual time: its oldest waiting turn, else its last turn given, else 0."""
    return (
        f"COALESCE((SELECT fair_turn FROM {JOB_TABLE} WHERE status = 'queued' "
        f"AND fair_turn IS NOT NULL AND queue = {queue_param} ORDER BY fair_turn LIMIT 1), "
        f"(SELECT last_turn FROM {FAIR_LANE_TABLE} WHERE queue = {queue_param} "
        "ORDER BY last_turn DESC LIMIT 1), 0)"
    )


def _advance_lanes(cursor: Any, d: Any, queue: str, spans: dict[str, float]) -> dict[str, float]:
    """Move each lane's last turn on by its span (from ``V`` if it fell behind); the new ends."""
    keys = list(spans)
    if d.postgres:
        cursor.execute(
            f"WITH v AS (SELECT {_virtual_time('%(queue)s')} AS turn) "
            f"INSERT INTO {FAIR_LANE_TABLE} (queue, key, last_turn, updated_at) "
            "SELECT %(queue)s, k.key, v.turn + k.span, statement_timestamp() "
            "FROM unnest(%(keys)s::text[], %(spans)s::float8[]) AS k(key, span), v "
            "ON CONFLICT (queue, key) DO UPDATE SET updated_at = EXCLUDED.updated_at, "
            f"last_turn = GREATEST({FAIR_LANE_TABLE}.last_turn + "
            f"(EXCLUDED.last_turn - (SELECT turn FROM v)), EXCLUDED.last_turn) "
            "RETURNING key, last_turn",
            {"queue": queue, "keys": keys, "spans": [spans[k] for k in keys]},
        )
        return dict(cursor.fetchall())
    cursor.execute(f"SELECT {_virtual_time('%s')}", [queue, queue])
    now_turn = cursor.fetchone()[0]
    ends = {}
    stamp = d.ts(timezone.now())
    for key in keys:
        cursor.execute(
            f"INSERT INTO {FAIR_LANE_TABLE} (queue, key, last_turn, updated_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (queue, key) DO UPDATE SET "
            f"last_turn = max({FAIR_LANE_TABLE}.last_turn + %s, excluded.last_turn), "
            "updated_at = excluded.updated_at RETURNING last_turn",
            [queue, key, now_turn + spans[key], stamp, spans[key]],
        )
        ends[key] = cursor.fetchone()[0]
    return ends


def forget_keyed_queues() -> None:
    """Forget which queues were marked keyed (their rows were deleted: tests, a reset)."""
    with _keyed_lock:
        _keyed_queues.clear()


def _mark_keyed(queue: str, using: str) -> None:
    """Flag the queue as holding keyed jobs (once per process), so workers claim them."""
    if queue in _keyed_queues:
        return
    if not Queue.objects.using(using).filter(name=queue, keyed=True).exists():
        _, created = Queue.objects.using(using).get_or_create(
            name=queue, defaults={"kind": Queue.default_kind(queue), "keyed": True}
        )
        if not created:
            Queue.objects.using(using).filter(name=queue).update(keyed=True)
    with _keyed_lock:
        _keyed_queues.add(queue)
