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
    """A count that stops at a cap: exact, capped (``10,000+``) or estimated (``≈``).

    ``value`` is exact unless ``capped`` (then it is the cap) or ``estimated``
    (then it is the planner's row estimate of a whole table, nothing was
    counted). ``value`` is None when even the capped count ran out of time.
    ``estimate`` is the planner's guess of the full count (PostgreSQL, when
    capped). Every face shows a count the same way: ``str()`` is the text.
    """

    value: int | None
    capped: bool = False
    estimate: int | None = None
    estimated: bool = False

    def __str__(self) -> str:
        if self.value is None:
            return f"≈{self.estimate:,}" if self.estimate is not None else "?"
        if self.estimated:
            return f"≈{self.value:,}"
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"

    def __int__(self) -> int:
        return self.value if self.value is not None else (self.estimate or 0)

    @property
    def exact(self) -> bool:
        """Counted to the end: neither stopped at the cap nor guessed."""
        return self.value is not None and not (self.capped or self.estimated)

    @property
    def known(self) -> bool:
        """Whether there is any number to show (a count or an estimate)."""
        return self.value is not None or self.estimate is not None


def count_cap() -> int:
    """The most rows any count reads (knob ``COUNT_CAP``)."""
    return int(knob("COUNT_CAP"))


def capped_count(queryset: QuerySet[Any], limit: int | None = None) -> CountResult:
    """Count ``queryset`` but stop at ``limit`` (default ``COUNT_CAP``): never a full scan.

    No time bound of its own and no estimate: for small sets (a job's
    children, orphaned jobs, new rows since a page loaded) read under the
    caller's statement timeout. ``estimated_count`` is the one for big lists.
    """
    limit = count_cap() if limit is None else limit
    n = queryset.order_by()[: limit + 1].count()  # Django wraps a sliced count in a subquery.
    return CountResult(min(n, limit), capped=n > limit)


def table_estimate(table: str, using: str = "default") -> CountResult | None:
    """The planner's row estimate for a whole ``table`` (PostgreSQL), or None when unknown."""
    if connections[using].vendor != "postgresql":
        return None
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table]
        )
        row = cursor.fetchone()
    if not row or row[0] is None or row[0] < 0:
        return None  # never analysed
    return CountResult(int(row[0]), estimated=True)


def estimated_count(queryset: QuerySet[Any], cap: int | None = None) -> CountResult:
    """Count ``queryset`` up to ``cap`` rows (knob ``COUNT_CAP``), never the whole table.

    The count runs as ``SELECT COUNT(*) FROM (… LIMIT cap + 1)``; on PostgreSQL
    it is also bounded in time, and past the cap the planner's row estimate is
    given as ``estimate``.
    """
    cap = count_cap() if cap is None else int(cap)
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
