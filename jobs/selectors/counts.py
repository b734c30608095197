"""Counts that never scan a whole table: exact up to a cap, then an estimate.

Counting is the dear part of a first page: up to ``COUNT_CAP + 1`` index
entries read for every request (10,001 for an unfiltered list at a million
jobs, 3-17 ms of PostgreSQL's time), where the page itself reads 51. A list
polled many times a second would spend most of its database time counting
the same thing again, so ``RecentCounts`` keeps the counts that took real
work (``COUNT_CACHE_MIN_ROWS`` or more rows, or out of time) for
``COUNT_CACHE_SECONDS``, per process. Small counts are cheap and always
counted afresh: a count of a few hundred jobs is exact as of the request.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import QuerySet

from jobs.conf import knob

# A capped count that has not finished in this time is reported as unknown
# (PostgreSQL only): a rare free-text match must not hold a page for seconds.
COUNT_TIMEOUT_MS = 1000
# A count of at least this many rows (or one out of time) is kept for
# COUNT_CACHE_SECONDS by ``RecentCounts``; below it, every request counts.
COUNT_CACHE_MIN_ROWS = 1000
COUNT_CACHE_SECONDS = 2.0
COUNT_CACHE_ENTRIES = 512


@dataclass(frozen=True)
class CountResult:
    """A count that stops at ``cap``: ``value`` is exact unless ``capped``.

    ``value`` is None when even the capped count ran out of time.
    ``estimate`` is the planner's guess of the full count (PostgreSQL, when capped).
    """

    value: int | None
    capped: bool
    estimate: int | None = None


def estimated_count(queryset: QuerySet[Any], cap: int | None = None) -> CountResult:
    """Count ``queryset`` up to ``cap`` rows (knob ``COUNT_CAP``), never the whole table.

    The count runs as ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``; on PostgreSQL
    it is also bounded in time, and past the cap the planner's row estimate is
    given as ``estimate``.
    """
    cap = int(knob("COUNT_CAP") if cap is None else cap)
    bounded = queryset.order_by()[: cap + 1]
    alias = queryset.db
    postgres = connections[alias].vendor == "postgresql"
    try:
        if postgres:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                # SET LOCAL outlives a released savepoint: put the old value back.
                cursor.execute(
                    "SELECT current_setting('statement_timeout'), "
                    "set_config('statement_timeout', %s, true)",
                    [f"{int(COUNT_TIMEOUT_MS)}ms"],
                )
                previous = cursor.fetchone()[0]
                value = bounded.count()
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
        else:
            value = bounded.count()
    except DatabaseError:
        if not postgres:
            raise
        return CountResult(value=None, capped=True, estimate=planner_estimate(queryset))
    if value > cap:
        estimate = planner_estimate(queryset) if postgres else None
        return CountResult(value=cap, capped=True, estimate=estimate)
    return CountResult(value=value, capped=False)


def planner_estimate(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's own row estimate for ``queryset`` (EXPLAIN, no execution)."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    try:
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
    except DatabaseError:
        return None
    if isinstance(plan, str):
        plan = json.loads(plan)
    try:
        return int(plan[0]["Plan"]["Plan Rows"])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


class RecentCounts:
    """The counts that took real work, kept for ``seconds`` per key (per process, bounded).

    Thread-safe; two threads that miss at once both count (either answer is
    kept). What is kept is a ``CountResult`` as it was when counted, so a count
    read from here may be up to ``seconds`` old: at most a few seconds behind
    the page it goes with, and only for counts of ``min_rows`` jobs or more
    (or counts that ran out of time, which would take the same second again).
    """

    def __init__(
        self,
        seconds: float = COUNT_CACHE_SECONDS,
        min_rows: int = COUNT_CACHE_MIN_ROWS,
        entries: int = COUNT_CACHE_ENTRIES,
    ) -> None:
        self.seconds, self.min_rows, self.entries = seconds, min_rows, entries
        self._lock = threading.Lock()
        self._kept: OrderedDict[Hashable, tuple[float, CountResult]] = OrderedDict()

    def get(self, key: Hashable, count: Callable[[], CountResult]) -> CountResult:
        """The kept count for ``key`` while fresh, else ``count()`` (kept if it was dear)."""
        now = time.monotonic()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and now - kept[0] < self.seconds:
                return kept[1]
        result = count()
        if result.value is None or result.value >= self.min_rows:
            with self._lock:
                self._kept[key] = (time.monotonic(), result)
                self._kept.move_to_end(key)
                while len(self._kept) > self.entries:
                    self._kept.popitem(last=False)
        return result

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


recent_counts = RecentCounts()
