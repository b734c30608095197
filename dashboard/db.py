"""Keeping dashboard reads cheap on big tables.

Three tools: a statement timeout around every page's reads (PostgreSQL
``SET LOCAL statement_timeout`` inside a read transaction), counts capped at
``COUNT_CAP`` (``SELECT count(*) FROM (… LIMIT cap + 1)`` stops reading at the
cap instead of counting a million rows), and the planner's row estimate from
``pg_class.reltuples`` for an unfiltered table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.db import DatabaseError, connections
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs import replica
from jobs.conf import knob
from jobs.selectors.timeouts import bounded_reads, is_timeout

__all__ = ["Count", "bounded", "bounded_reads", "capped_count", "is_timeout", "table_estimate"]


@dataclass(frozen=True)
class Count:
    """A count as shown to people: exact, capped (``10,000+``) or estimated (``≈``)."""

    value: int
    capped: bool = False
    estimated: bool = False

    def __str__(self) -> str:
        if self.estimated:
            return f"≈{self.value:,}"
        return f"{self.value:,}+" if self.capped else f"{self.value:,}"

    def __int__(self) -> int:
        return self.value

    @property
    def exact(self) -> bool:
        return not (self.capped or self.estimated)


def cap() -> int:
    return int(knob("COUNT_CAP"))


def capped_count(qs: QuerySet, limit: int | None = None) -> Count:
    """Count ``qs`` but stop at ``limit`` (default ``COUNT_CAP``): never a full scan."""
    limit = cap() if limit is None else limit
    n = qs.order_by()[: limit + 1].count()  # Django wraps a sliced count in a subquery.
    return Count(min(n, limit), capped=n > limit)


def is_postgres(using: str = "default") -> bool:
    return connections[using].vendor == "postgresql"


def table_estimate(table: str, using: str = "default") -> Count | None:
    """The planner's row estimate for ``table`` (PostgreSQL), or None when unknown."""
    if not is_postgres(using):
        return None
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table]
        )
        row = cursor.fetchone()
    if not row or row[0] is None or row[0] < 0:
        return None  # never analysed
    return Count(int(row[0]), estimated=True)


def timeout_response(request: HttpRequest) -> HttpResponse:
    """The 503 page shown when a read ran past the dashboard's statement timeout."""
    ms = int(knob("DASHBOARD_STATEMENT_TIMEOUT_MS"))
    return render(request, "dashboard/timeout.html", {"timeout_ms": ms}, status=503)


def bounded(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Render a read-only view under ``bounded_reads``; a timeout becomes a 503 page.

    Its reads go to the read replica when one is configured and fresh
    (``jobs.replica``), else to the primary.

    Views must return an already rendered response (``render``), so the lazy
    querysets a template touches run inside the timeout too.
    """

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        def read() -> HttpResponse:
            try:
                with bounded_reads(replica.read_alias()):
                    return view(request, *args, **kwargs)
            except DatabaseError as error:
                if not is_timeout(error):
                    raise
                return timeout_response(request)

        return replica.on_replica(read, request)  # the read replica, when there is one

    return wrapped
