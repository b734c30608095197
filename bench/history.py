"""Event history at scale (issue 18): reads, drain and retention on a big history.

    .venv/bin/python bench/history.py [--events 10000000] [--jobs 1000000] [--days 10]
        [--partitioned] [--project PATH] [--database bench_history]

Fills a fresh database with ``--jobs`` finished jobs made evenly over the
last ``--days`` days (UUIDv7 ids of their creation time, as the engine makes
them) and ``--events`` events spread evenly over them, with ``INSERT ...
SELECT generate_series`` one day at a time. With ``--partitioned`` the events
table is partitioned first (``manage.py controlplane_partition_events``) and
the daily partitions of those days are made, as a reaper running through
them would have. One job in a hundred is still
waiting (``run_after`` a month ahead): its events must survive retention.

Then prints:
- the event poll p95: ``job_events_page`` (``GET /jobs/<id>/events?after=N``)
  on random jobs, and its plan;
- the job list p95: ``job_list`` (the dashboard's and the API's newest-first
  page), first pages and pages deep behind a random cursor;
- the claim plan check (``bench/engine.py``) and a drain of ``--drain``
  ping jobs by two worker processes beside the history;
- one retention run that deletes the oldest ``--retire-days`` days: the
  reaper's partition and retention steps until nothing is left to do, with
  its time and the WAL it wrote (after a CHECKPOINT, so both runs pay the
  same full-page images).

Run it once plain and once with ``--partitioned``, on the same sizes.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from engine import QUEUE, EngineSystem, claim_plan_check, python  # noqa: E402
from peers import percentile  # noqa: E402

DAY = timedelta(days=1)

# A UUIDv7 of a job made at ``ts``: its millisecond, the version, then bits of md5(n).
V7 = (
    "(lpad(to_hex((extract(epoch FROM {ts}) * 1000)::bigint), 12, '0') || '7' || "
    "substr(md5({n}::text), 1, 3) || '8' || substr(md5({n}::text), 4, 15))::uuid"
)


class HistoryEngine(EngineSystem):
    """The engine, counting only the drained queue's jobs (the history has its own events)."""

    def succeeded_count(self) -> int:
        return self.sql(
            "SELECT count(*) FROM controlplane_job WHERE queue = %s AND status = 'succeeded'",
            [QUEUE],
        )[0][0]

    def drain_window(self):
        return self.sql(
            "SELECT count(*), min(started_at), max(finished_at) FROM controlplane_job "
            "WHERE queue = %s AND status = 'succeeded'",
            [QUEUE],
        )[0]


def day_start(moment: datetime) -> datetime:
    return datetime.fromtimestamp(moment.timestamp() // 86400 * 86400, UTC)


def partitioned(engine: EngineSystem) -> bool:
    return bool(
        engine.sql(
            "SELECT 1 FROM pg_class WHERE oid = 'controlplane_jobevent'::regclass AND relkind = 'p'"
        )
    )


def fill(engine: EngineSystem, jobs: int, events: int, days: int, start: datetime) -> None:
    """``jobs`` jobs over ``days`` days from ``start``, ``events`` events among them."""
    per_job = max(1, events // jobs)
    per_day = jobs // days
    if partitioned(engine):
        from jobs.partitions import attach_partition, event_partitions

        for n in range(days):
            begin = start + DAY * n
            if not any(p.start <= begin < p.end for p in event_partitions()):
                attach_partition(begin, begin + DAY)
    step = 86400.0 / per_day
    for n in range(days):
        begin = start + DAY * n
        first = n * per_day
        ts = f"(%s::timestamptz + (g - {first}) * interval '{step} seconds')"
        started = time.perf_counter()
        engine.sql(
            "INSERT INTO controlplane_job (id, operation, queue, payload, status, priority, "
            "run_after, attempts, max_attempts, lease_requeues, progress_current, error_code, "
            "error_message, created_at, started_at, finished_at, last_event_seq, last_event_at) "
            f"SELECT {V7.format(ts=ts, n='g')}, 'ping', 'history', '{{}}', "
            "CASE WHEN g %% 100 = 0 THEN 'queued' ELSE 'succeeded' END, 0, "
            f"CASE WHEN g %% 100 = 0 THEN now() + interval '30 days' ELSE {ts} END, "
            f"1, 1, 0, 0, '', '', {ts}, "
            f"CASE WHEN g %% 100 = 0 THEN NULL ELSE {ts} + interval '1 second' END, "
            f"CASE WHEN g %% 100 = 0 THEN NULL ELSE {ts} + interval '1 second' END, "
            f"{per_job}, {ts} "
            "FROM generate_series(%s, %s) g",
            [begin] * 6 + [first, first + per_day - 1],
        )
        engine.sql(
            "INSERT INTO controlplane_jobevent (job_id, seq, ts, event, level, message, fields) "
            "SELECT j.id, s, j.created_at + s * interval '1 ms', CASE WHEN s = 1 "
            "THEN 'job.enqueued' WHEN s = 2 THEN 'job.started' WHEN s = %s THEN 'job.succeeded' "
            "ELSE 'step' END, 'info', '', '{}' FROM controlplane_job j "
            "CROSS JOIN generate_series(1, %s) s "
            "WHERE j.queue = 'history' AND j.created_at >= %s AND j.created_at < %s",
            [per_job, per_job, begin, begin + DAY],
        )
        print(
            f"  day {n + 1}/{days}: {per_day:,} jobs, {per_day * per_job:,} events "
            f"in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
    engine.sql("VACUUM ANALYZE controlplane_job")
    engine.sql("VACUUM ANALYZE controlplane_jobevent")
    engine.sql("CHECKPOINT")


def sizes(engine: EngineSystem) -> str:
    rows = engine.sql(
        "SELECT (SELECT count(*) FROM controlplane_job), (SELECT count(*) FROM "
        "controlplane_jobevent), pg_size_pretty(pg_total_relation_size('controlplane_job')), "
        "pg_size_pretty(coalesce((SELECT sum(pg_total_relation_size(relid)) FROM "
        "pg_partition_tree('controlplane_jobevent') WHERE isleaf), "
        "pg_total_relation_size('controlplane_jobevent')))"
    )[0]
    return f"{rows[0]:,} jobs ({rows[2]}), {rows[1]:,} events ({rows[3]})"


def sample_ids(engine: EngineSystem, n: int) -> list[uuid.UUID]:
    total = engine.sql("SELECT count(*) FROM controlplane_job")[0][0]
    share = min(100.0, 100.0 * n * 20 / max(total, 1))
    rows = engine.sql(
        f"SELECT id FROM controlplane_job TABLESAMPLE SYSTEM ({share}) "
        "WHERE queue = 'history' LIMIT %s",
        [n * 20],
    )
    ids = [r[0] for r in rows]
    random.shuffle(ids)
    return ids[:n]


def timed_ms(fn, *args, **kwargs) -> float:
    started = time.perf_counter()
    fn(*args, **kwargs)
    return (time.perf_counter() - started) * 1000


def event_poll(engine: EngineSystem, samples: int) -> None:
    from jobs.selectors.jobs import job_events_page

    ids = sample_ids(engine, samples)
    times = [timed_ms(job_events_page, i, after=random.randint(0, 4)) for i in ids]
    print(
        f"  event poll (job_events_page, {len(times)} random jobs): "
        f"p50 {percentile(times, 50):.2f} ms, p95 {percentile(times, 95):.2f} ms"
    )
    plan = engine.sql(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT e.id, e.seq FROM controlplane_job j "
        "LEFT JOIN controlplane_jobevent e ON e.job_id = j.id AND e.seq > 2 AND e.seq <= 502 "
        "WHERE j.id = %s ORDER BY e.seq",
        [ids[0]],
    )
    for (line,) in plan:
        print(f"    {line}")


def job_list_p95(engine: EngineSystem, samples: int) -> None:
    from jobs.selectors.jobs import JobCursor, job_list

    firsts = [timed_ms(job_list) for _ in range(samples)]
    stamps = [
        r[0]
        for r in engine.sql(
            "SELECT created_at FROM controlplane_job TABLESAMPLE SYSTEM (1) LIMIT %s", [samples]
        )
    ]
    deep = [timed_ms(job_list, cursor=JobCursor(s, uuid.UUID(int=0))) for s in stamps]
    print(
        f"  job list (job_list, 50 rows): first page p50 {percentile(firsts, 50):.2f} ms, "
        f"p95 {percentile(firsts, 95):.2f} ms; behind a random cursor p50 "
        f"{percentile(deep, 50):.2f} ms, p95 {percentile(deep, 95):.2f} ms"
    )


def retention(engine: EngineSystem, start: datetime, retire_days: int) -> None:
    """Delete the jobs made in the oldest ``retire_days`` days, as the reaper would."""
    from workers.config import ReaperConfig
    from workers.reaper import Reaper, ReaperResult

    cutoff = start + DAY * retire_days
    now = datetime.now(UTC)
    days = (now - cutoff) / DAY
    reaper = Reaper(ReaperConfig(retention_days=days, retention_batch_size=1000))
    steps = [getattr(reaper, "_partitions", None), reaper._retention]
    before_jobs, before_events = engine.sql(
        "SELECT (SELECT count(*) FROM controlplane_job), (SELECT count(*) FROM "
        "controlplane_jobevent)"
    )[0]
    engine.sql("CHECKPOINT")
    lsn = engine.sql("SELECT pg_current_wal_lsn()")[0][0]
    started = time.perf_counter()
    passes = 0
    spent = [0.0, 0.0]
    while True:
        passes += 1
        result = ReaperResult()
        for n, step in enumerate(steps):
            if step is not None:
                began = time.perf_counter()
                step(now, result)
                spent[n] += time.perf_counter() - began
        if result.jobs_deleted == 0 and not getattr(result, "partitions_dropped", 0):
            break
    seconds = time.perf_counter() - started
    wal = engine.sql("SELECT pg_current_wal_lsn() - %s::pg_lsn", [lsn])[0][0]
    after_jobs, after_events = engine.sql(
        "SELECT (SELECT count(*) FROM controlplane_job), (SELECT count(*) FROM "
        "controlplane_jobevent)"
    )[0]
    kept = engine.sql(
        "SELECT count(*) FROM controlplane_job WHERE queue = 'history' AND created_at < %s",
        [cutoff],
    )[0][0]
    print(
        f"  retention of {retire_days} day(s): {before_jobs - after_jobs:,} jobs and "
        f"{before_events - after_events:,} events deleted in {seconds:.1f} s "
        f"({passes} passes), WAL {int(wal) / 2**20:,.0f} MiB; {kept:,} waiting jobs kept"
    )
    if steps[0] is not None:
        print(
            f"    partition drops {spent[0]:.1f} s, job DELETEs (and the events left in "
            f"DEFAULT) {spent[1]:.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=10, help="days of history (one partition each)")
    parser.add_argument("--retire-days", type=int, default=2)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--drain", type=int, default=10_000, help="jobs drained (0 skips it)")
    parser.add_argument("--partitioned", action="store_true", help="partition the events first")
    parser.add_argument("--project", type=Path, default=BENCH_DIR.parent)
    parser.add_argument("--database", default="bench_history")
    args = parser.parse_args()

    engine = HistoryEngine(args.project.resolve(), args.database, 8)
    engine.setup()
    if args.partitioned:
        subprocess.run(
            [python(), "manage.py", "controlplane_partition_events"], cwd=engine.cwd, check=True
        )
    kind = "partitioned by job id" if partitioned(engine) else "plain"
    print(f"events table: {kind}; project {args.project.resolve()}")
    start = day_start(datetime.now(UTC)) - DAY * (args.days - 1)
    started = time.perf_counter()
    fill(engine, args.jobs, args.events, args.days, start)
    print(f"  filled in {time.perf_counter() - started:.1f} s: {sizes(engine)}")

    event_poll(engine, args.samples)
    job_list_p95(engine, args.samples)
    engine.enqueue_bulk(32)
    claim_ok = claim_plan_check(8, "claim of 8 beside the history")
    print(f"  claim plan check: {'PASS' if claim_ok else 'FAIL'}")
    bench_jobs = "SELECT id FROM controlplane_job WHERE queue = %s"
    engine.sql(f"DELETE FROM controlplane_jobevent WHERE job_id IN ({bench_jobs})", [QUEUE])
    engine.sql("DELETE FROM controlplane_job WHERE queue = %s", [QUEUE])
    if args.drain:
        drain, _ = engine.drain_live(args.drain, 2, 8, 2.0)
        print(
            f"  drain beside the history, 2 processes: {drain.jobs:,} jobs in "
            f"{drain.seconds:.2f} s = {drain.rate:,.0f}/s"
        )
    retention(engine, start, args.retire_days)
    print(f"  after retention: {sizes(engine)}")


if __name__ == "__main__":
    main()
