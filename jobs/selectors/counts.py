"""Counts that never scan a whole table: exact up to a cap, then an estimate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import QuerySet

from jobs.conf import knob

# A capped count that has not finished in this time is reported as unknown
# (PostgreSQL only): a rare free-text match must not hold a page for seconds.
COUNT_TIMEOUT_MS = 1000


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
                cursor.execute("SHOW statement_timeout")
                previous = cursor.fetchone()[0]
                cursor.execute(f"SET LOCAL statement_timeout = {int(COUNT_TIMEOUT_MS)}")
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
