"""The rows flow keys leave behind, pruned once idle.

Every key in use has a ``FlowKey`` row (the claim's lock, and its bucket)
and a ``FairLane`` row per queue (its next turn). Tenants come and go, so
the reaper deletes the rows of keys idle for ``IDLE_DAYS``: a lane with no
queued job of its key, and a key row untouched since. Nothing is lost: a
lane that comes back starts at its queue's virtual time, as an idle lane
would anyway, and a bucket idle that long would be full again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connections

from jobs.dialect import dialect
from jobs.tables import FAIR_LANE_TABLE, FLOW_KEY_TABLE, JOB_TABLE

IDLE_DAYS = 1.0


def prune_idle_keys(now: datetime, *, using: str = "default") -> int:
    """Delete the lanes and key rows idle since ``now - IDLE_DAYS``; return how many."""
    d = dialect(using)
    cutoff = d.ts(now - timedelta(days=IDLE_DAYS))
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {FAIR_LANE_TABLE} WHERE updated_at < %s AND NOT EXISTS ("
            f"SELECT 1 FROM {JOB_TABLE} j WHERE j.status = 'queued' AND j.fair_turn IS NOT NULL "
            f"AND j.queue = {FAIR_LANE_TABLE}.queue AND j.fair_key = {FAIR_LANE_TABLE}.key)",
            [cutoff],
        )
        lanes = cursor.rowcount
        cursor.execute(
            f"DELETE FROM {FLOW_KEY_TABLE} WHERE COALESCE(refilled_at, created_at) < %s",
            [cutoff],
        )
        return lanes + cursor.rowcount
