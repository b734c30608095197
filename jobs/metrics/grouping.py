"""SQL that sums rollup rows per time bucket, the same on PostgreSQL and SQLite.

Rows of ``MetricRollup`` (minutes) or ``MetricSpan`` (quarters, hours) are grouped by
``floor(epoch(ts) / step)``, whole steps since the Unix epoch in UTC, and
every counter and every histogram bucket is summed in the database (a
histogram is a JSON array of per-bucket counts: one ``SUM`` per element), so
a group comes back as one row whatever the number of rows it sums.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db.models import BigIntegerField, F, FloatField, Func, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from jobs.metrics import buckets

HISTOGRAMS = ("wait", "run")


class EpochSeconds(Func):
    """Whole seconds since the Unix epoch of a timestamp column."""

    output_field = BigIntegerField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(
            compiler, connection, template="(EXTRACT(EPOCH FROM %(expressions)s))::bigint", **extra
        )

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django stores an aware datetime as UTC text, which strftime('%s') reads.
        strftime = Func(
            Value("%s"),
            *self.get_source_expressions(),
            function="strftime",
            output_field=self.output_field,
        )
        sql, params = strftime.as_sql(compiler, connection)
        return f"CAST({sql} AS INTEGER)", params


def epoch_bucket(column: str, step_seconds: int) -> Func:
    """The bucket of ``column``: whole ``step_seconds`` since the epoch (an integer)."""
    return Func(
        EpochSeconds(F(column)),
        Value(int(step_seconds)),
        template="(%(expressions)s)",
        arg_joiner=" / ",
        output_field=BigIntegerField(),
    )


def bucket_start(bucket: int, step_seconds: int) -> datetime:
    return datetime.fromtimestamp(int(bucket) * int(step_seconds), UTC)


def sums(counters: Iterable[str], *, histograms: bool = True, seconds: bool = False) -> dict:
    """``Sum`` aggregates named ``n_<counter>``, ``<histogram>_<i>`` per histogram bucket,
    and ``<histogram>_sum`` for the observed seconds."""
    out: dict[str, Any] = {f"n_{name}": Sum(name) for name in counters}
    if histograms:
        for histogram in HISTOGRAMS:
            for i in range(buckets.SLOTS):
                out[f"{histogram}_{i}"] = Sum(
                    Cast(KT(f"{histogram}_bucket_counts__{i}"), BigIntegerField())
                )
    if seconds:
        for histogram in HISTOGRAMS:
            out[f"{histogram}_sum"] = Sum(f"{histogram}_sum", output_field=FloatField())
    return out


def counts_of(row: dict[str, Any], counters: Iterable[str]) -> dict[str, int]:
    return {name: int(row.get(f"n_{name}") or 0) for name in counters}


def histogram_of(row: dict[str, Any], histogram: str) -> list[int]:
    """A summed row's per-bucket counts of ``histogram`` (zeros where it had none)."""
    return [int(row.get(f"{histogram}_{i}") or 0) for i in range(buckets.SLOTS)]
