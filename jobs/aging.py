"""Priority aging: a ready job that keeps waiting slowly rises in priority.

With ``PRIORITY_AGING_SECONDS`` = ``a`` (0: off), the reaper raises by one
the priority of every queued job for each further ``a`` seconds it has been
ready (since ``run_after``), up to ``PRIORITY_MAX``. So a priority -10 job
that waited ``10 × a`` seconds competes with fresh priority-0 work, and a
steady stream of high-priority jobs cannot starve the rest for ever.
``Job.priority_aged`` says how much of a job's priority aging added (shown
in its JSON and on its page); a retry or requeue keeps it.

A bump is a plain UPDATE of ``priority``, no event: the timeline records
what happened to a job, and waiting is not an event. The claim reads
``priority`` as it always did, so aging costs the claim nothing; the
reaper's pass touches at most ``BATCH`` jobs.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connections

from jobs.dialect import dialect
from jobs.models import PRIORITY_MAX
from jobs.tables import JOB_TABLE

BATCH = 10_000


def age_priorities(*, every_seconds: float, now: datetime, using: str = "default") -> int:
    """Raise by one the priority of queued jobs owed a step; return how many moved.

    A job is owed a step once it has been ready ``(priority_aged + 1) ×
    every_seconds``. One step per pass: a job several steps behind (the
    setting was just turned on) catches up over the following passes.
    """
    if every_seconds <= 0:
        return 0
    d = dialect(using)
    step = timedelta(seconds=every_seconds)
    if d.postgres:
        sql = (
            f"UPDATE {JOB_TABLE} SET priority = priority + 1, priority_aged = priority_aged + 1 "
            f"WHERE id IN (SELECT id FROM {JOB_TABLE} WHERE status = 'queued' AND priority < %s "
            "AND run_after + (priority_aged + 1) * %s::interval <= %s LIMIT %s)"
        )
        params = [PRIORITY_MAX, step, now, BATCH]
    else:
        # SQLite stores times as text: compare them as Julian days.
        sql = (
            f"UPDATE {JOB_TABLE} SET priority = priority + 1, priority_aged = priority_aged + 1 "
            f"WHERE id IN (SELECT id FROM {JOB_TABLE} WHERE status = 'queued' AND priority < %s "
            "AND julianday(run_after) + (priority_aged + 1) * %s <= julianday(%s) LIMIT %s)"
        )
        params = [PRIORITY_MAX, every_seconds / 86400.0, d.ts(now), BATCH]
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
