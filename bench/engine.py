"""Speed of the job engine on PostgreSQL, beside Procrastinate and PGQueuer.

    .venv/bin/python bench/engine.py [--jobs N] [--runs 3] [--peers] [--big 1000000]

Each run measures, on a fresh job table: enqueue rate (one job per
``enqueue`` call, and ``enqueue_many`` in chunks of 1,000), drain rate of
no-op ``ping`` jobs with 1, 2 and 4 real ``runworker`` processes (first
``job.started`` to last ``job.succeeded``, from the job events), and pickup
latency (``Job.created_at`` to the ``job.started`` event) with one idle
worker woken by NOTIFY. ``--peers`` runs the same protocol on Procrastinate
and PGQueuer in the same run and prints our figures as ratios to theirs.
``--big`` then fills the table with finished and future-scheduled jobs and
shows the claim (and completion) plans and the drain rate beside them.

Cold start (ours and PGQueuer): ready to claim is the time from a worker's
exec to the start of a job that was waiting for it (median of
``--cold-execs`` execs; PGQueuer also the way ``pgq run`` starts it), with
the CPU the process had used by then. The cold-start drain puts ``--jobs``
in the table, then starts ``--cold-processes`` worker processes and runs
from their exec to the last success: ours as ``runworker --processes P``
(one start-up; the children are forked from it) and as P separate execs.
The project's bytecode is compiled first, as pip and the Docker image do
(this environment sets PYTHONDONTWRITEBYTECODE). ``--phases`` picks the
phases to run.

See bench/README.md for how to read the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from peers import (  # noqa: E402
    BACKENDS_SQL,
    DRIVER_NAME,
    LOG_DIR,
    QueueSystem,
    WorkerGroup,
    dsn_for,
    ensure_database,
    median,
    percentile,
    python,
)

# What a worker imports from the project, compiled as an installed package would be.
PACKAGES = ("controlplane", "django_controlplane", "jobs", "workers", "dashboard")
QUEUE = "bench"
BIG_DRAINS = 3  # drains beside the big table; their median is compared
TARGETS = {
    "drain_2": ("drain, 2 processes", ">=", 3000.0),
    "enqueue_bulk": ("bulk enqueue", ">=", 20000.0),
    "pickup_p50": ("pickup p50 (ms)", "<", 5.0),
    "pickup_p95": ("pickup p95 (ms)", "<", 10.0),
    "ready_ms": ("ready to claim (ms)", "<=", 500.0),
}
PHASES = ("enqueue", "drain", "pickup", "idle", "cold")
# The worker's readiness line (workers.engine): its log timestamp, local time.
READY_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ workers worker\.started", re.M
)


# --- our engine --------------------------------------------------------------------


class EngineSystem(QueueSystem):
    """Our control plane: Django in this process, ``manage.py runworker`` for workers."""

    def __init__(
        self, project: Path, database: str, concurrency: int, *, rollup: bool = False
    ) -> None:
        # With ``rollup`` a reaper runs beside the workers during every drain and
        # rolls the metrics up as fast as it can (settle 0 s, a pass every 0.5 s):
        # the drain's price for issue 16's rollup, measured in the same run.
        self.rollup = rollup
        self.name = f"engine k{concurrency}" + (" +rollup" if rollup else "")
        self.cold_start = not rollup
        self.concurrency = concurrency
        self.cwd = project
        self.database = database
        self.url = dsn_for(database).replace("postgresql://", "postgres://", 1)

    def setup(self) -> None:
        # A fresh database every time: migrations edited in place would otherwise
        # leave an old schema (and its indexes) behind.
        ensure_database(self.database, fresh=True)
        os.environ["DATABASE_URL"] = self.url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
        subprocess.run(
            [python(), "manage.py", "migrate", "--no-input", "-v", "0"],
            cwd=self.cwd,
            check=True,
            env={**os.environ},
        )
        # Bytecode, as pip writes it for an installed package and the Dockerfile for the
        # image; with PYTHONDONTWRITEBYTECODE set and none on disk, each worker exec would
        # compile ~70 modules (about 0.2 s of CPU), which no deployment pays.
        subprocess.run(
            [python(), "-m", "compileall", "-q", "manage.py", *PACKAGES],
            cwd=self.cwd,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        sys.path.insert(0, str(self.cwd))
        import django

        django.setup()
        from django.db import connection

        connection.close()
        connection.settings_dict["OPTIONS"]["application_name"] = DRIVER_NAME

    # Plain SQL helpers on Django's connection (autocommit).
    def sql(self, statement: str, params: list | None = None) -> list[tuple]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(statement, params or [])
            return cursor.fetchall() if cursor.description else []

    def reset(self) -> None:
        self.sql(
            "TRUNCATE controlplane_jobevent, controlplane_batchreceipt, "
            "controlplane_batchmessage, controlplane_job CASCADE; "
            "DELETE FROM controlplane_worker; DELETE FROM controlplane_queue WHERE name = %s",
            [QUEUE],
        )

    def enqueue_single(self, n: int) -> None:
        from jobs.enqueue import enqueue

        for _ in range(n):
            enqueue("ping", {}, queue=QUEUE)

    def enqueue_bulk(self, n: int, chunk: int = 1000) -> None:
        from jobs.enqueue import JobSpec, enqueue_many

        for start in range(0, n, chunk):
            enqueue_many([JobSpec("ping", {}, queue=QUEUE) for _ in range(min(chunk, n - start))])

    def enqueue_for_drain(self, n: int) -> None:
        from django.db import transaction

        with transaction.atomic():
            self.enqueue_bulk(n)

    def worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]:
        argv = [
            python(),
            "manage.py",
            "runworker",
            "--queue",
            QUEUE,
            "--concurrency",
            str(concurrency),
        ]
        if processes > 1:
            argv += ["--processes", str(processes)]
        if self.rollup:
            return [argv, [python(), "manage.py", "reaper", "--interval", "0.5"]]
        return [argv]

    def worker_env(self, poll: float) -> dict[str, str]:
        env = {
            "DATABASE_URL": self.url,
            "CONTROLPLANE_POLL_SECONDS": str(poll),
        }
        if self.rollup:
            env["CONTROLPLANE_METRICS_SETTLE_SECONDS"] = "0"
        return env

    def fresh_worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]:
        """``processes`` separate ``runworker`` processes (no supervisor between them)."""
        return self.worker_argvs(1, concurrency, poll)[:1] * processes

    def ready_line_at(self, log: str) -> float | None:
        found = READY_LINE.search(log)
        if found is None:
            return None
        return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()

    def first_started_at(self) -> datetime | None:
        return self.sql("SELECT min(ts) FROM controlplane_jobevent WHERE event = 'job.started'")[0][
            0
        ]

    def workers_ready(self, group: WorkerGroup, processes: int) -> bool:
        return self.sql("SELECT count(*) FROM controlplane_worker")[0][0] >= processes

    def backend_pids(self) -> list[int]:
        return [r[0] for r in self.sql(BACKENDS_SQL)]

    def succeeded_count(self) -> int:
        return self.sql("SELECT count(*) FROM controlplane_jobevent WHERE event = 'job.succeeded'")[
            0
        ][0]

    def drain_window(self):
        count, first, last, started = self.sql(
            "SELECT count(*) FILTER (WHERE event = 'job.succeeded'), "
            "min(ts) FILTER (WHERE event = 'job.started'), "
            "max(ts) FILTER (WHERE event = 'job.succeeded'), "
            "count(*) FILTER (WHERE event = 'job.started') FROM controlplane_jobevent"
        )[0]
        if started != count:
            raise RuntimeError(f"engine: {started} job.started events for {count} job.succeeded")
        return count, first, last

    def drain_extra(self) -> dict[str, float]:
        jobs, claims = self.sql(
            "SELECT count(*), count(DISTINCT (worker_id, started_at)) FROM controlplane_job "
            "WHERE status = 'succeeded' AND worker_id IS NOT NULL"
        )[0]
        return {"jobs per claim": jobs / claims if claims else float("nan")}

    def enqueue_one(self) -> object:
        from jobs.enqueue import enqueue

        job = enqueue("ping", {}, queue=QUEUE)
        return job.id, job.created_at

    def started_latency(self, handle: object) -> float | None:
        job_id, created_at = handle
        rows = self.sql(
            "SELECT ts FROM controlplane_jobevent WHERE job_id = %s AND event = 'job.started'",
            [job_id],
        )
        return (rows[0][0] - created_at).total_seconds() if rows else None

    def finished(self, handle: object) -> bool:
        return bool(
            self.sql(
                "SELECT 1 FROM controlplane_job WHERE id = %s AND status = 'succeeded'", [handle[0]]
            )
        )


# --- one run -------------------------------------------------------------------------


def run_system(
    system: QueueSystem, args, results: dict[str, list[float]], *, process_counts, jobs: int
) -> None:
    """One run of the whole protocol on ``system``; appends each figure to ``results``."""

    def record(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    def say(text: str) -> None:
        print(f"  [{system.name}] {text}", flush=True)

    phases = args.phases
    if "enqueue" in phases:
        system.reset()
        singles = min(args.single, jobs)
        seconds = system.timed(system.enqueue_single, singles)
        record("enqueue_single", singles / seconds)
        seconds = system.timed(system.enqueue_bulk, jobs)
        record("enqueue_bulk", jobs / seconds)
        say(
            f"enqueue: single {results['enqueue_single'][-1]:,.0f}/s, "
            f"bulk {results['enqueue_bulk'][-1]:,.0f}/s"
        )

    for processes in process_counts if "drain" in phases else []:
        system.reset()
        drain, seconds = system.drain_live(jobs, processes, system.concurrency, args.poll)
        record("enqueue_bulk_1tx", jobs / seconds)
        record(f"drain_{processes}", drain.rate)
        extra = "".join(f", {k} {v:.2f}" for k, v in drain.extra.items())
        say(
            f"drain with {processes} process(es): {drain.jobs} jobs in {drain.seconds:.2f} s = "
            f"{drain.rate:,.0f}/s{extra}"
        )
        for key, value in drain.extra.items():
            record(f"drain_{processes} {key}", value)

    if "pickup" in phases:
        system.reset()
        latencies = system.pickup(args.pickup_samples, system.concurrency, args.pickup_poll)
        record("pickup_p50", percentile(latencies, 50))
        record("pickup_p95", percentile(latencies, 95))
        say(
            f"pickup: p50 {percentile(latencies, 50):.1f} ms, "
            f"p95 {percentile(latencies, 95):.1f} ms ({len(latencies)} samples)"
        )

    if "idle" in phases and args.idle_seconds > 0:
        system.reset()
        idle = system.idle_cpu(args.idle_seconds, system.concurrency, args.poll)
        record("idle_cpu", idle)
        say(f"idle worker: {idle:.2f}% of one core over {args.idle_seconds:.0f} s")

    if "cold" in phases and system.cold_start and args.cold_execs > 0:
        cold_start(system, args, record, say, jobs)


def cold_start(system: QueueSystem, args, record, say, jobs: int) -> None:
    """Ready to claim (median of ``--cold-execs`` execs, each way to start a worker) and the
    cold-start drain of ``jobs`` by ``--cold-processes`` fresh workers."""
    for label, argv in system.ready_variants(args.poll).items():
        starts = [
            system.ready_to_claim(system.concurrency, args.poll, argv)
            for _ in range(args.cold_execs)
        ]
        key = "ready_ms" + (f" {label}" if label else "")
        record(key, median([s.seconds for s in starts]) * 1000)
        record(f"{key} cpu", median([s.cpu for s in starts]) * 1000)
        lines = [s.ready_line for s in starts if s.ready_line is not None]
        if lines:
            record("ready_line_ms", median(lines) * 1000)
        say(
            f"ready to claim{f' ({label})' if label else ''}: exec to first start "
            + ", ".join(f"{s.seconds * 1000:.0f}" for s in starts)
            + f" ms (median {median([s.seconds for s in starts]) * 1000:.0f}); CPU by then "
            + f"{median([s.cpu for s in starts]) * 1000:.0f} ms"
            + (f"; exec to readiness line {median(lines) * 1000:.0f} ms" if lines else "")
        )
    p, k = args.cold_processes, system.concurrency
    # Ours twice: ``runworker --processes P`` (one interpreter start-up, the children are
    # forked from it) and P separate ``runworker`` execs (an autoscaler adding containers).
    ways = {"": system.worker_argvs(p, k, args.poll)}
    if system.fresh_worker_argvs(p, k, args.poll) != ways[""]:
        ways["separate"] = system.fresh_worker_argvs(p, k, args.poll)
    for label, argvs in ways.items():
        drain = system.cold_drain(jobs, argvs, args.poll)
        key = "cold_drain" + (f" {label}" if label else "")
        record(key, drain.rate)
        for name, value in drain.extra.items():
            record(f"{key} {name}", value)
        how = f"{p} separate execs" if label else f"{p} fresh worker process(es)"
        say(
            f"cold-start drain, {how}: {drain.jobs} jobs in {drain.seconds:.2f} s "
            f"from exec = {drain.rate:,.0f}/s"
            + "".join(f", {name} {value:.2f}" for name, value in drain.extra.items())
        )


# --- the claim on a big table ----------------------------------------------------------


def fill_big(engine: EngineSystem, finished: int, scheduled: int) -> None:
    engine.reset()
    engine.sql(
        "INSERT INTO controlplane_job (id, operation, queue, payload, status, priority, run_after, "
        "attempts, max_attempts, lease_requeues, progress_current, error_code, error_message, "
        "created_at, started_at, finished_at, last_event_seq, last_event_at, result) "
        "SELECT gen_random_uuid(), 'ping', %s, '{}', 'succeeded', 0, t, 1, 1, 0, 0, '', '', "
        "t, t, t, 3, t, '{\"pong\": true}' "
        "FROM (SELECT now() - interval '3 days' + g * interval '100 ms' AS t "
        "FROM generate_series(1, %s) g) s",
        [QUEUE, finished],
    )
    # Future jobs at priorities -1, 0 and 1: the higher ones sit ahead of today's
    # priority-0 jobs in claim order, and must not be walked through.
    engine.sql(
        "INSERT INTO controlplane_job (id, operation, queue, payload, status, priority, run_after, "
        "attempts, max_attempts, lease_requeues, progress_current, error_code, error_message, "
        "created_at, last_event_seq, last_event_at) "
        "SELECT gen_random_uuid(), 'ping', %s, '{}', 'queued', (g %% 3) - 1, "
        "now() + interval '1 day' + g * interval '1 s', 0, 1, 0, 0, '', '', now(), 1, now() "
        "FROM generate_series(1, %s) g",
        [QUEUE, scheduled],
    )
    engine.sql("ANALYZE controlplane_job")
    # Write the fill's ~1 GB of dirty pages out now, not during the drain below.
    engine.sql("CHECKPOINT")


class _Rollback(Exception):
    pass


AUTO_EXPLAIN_ON = (
    "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; "
    "SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; "
    "SET auto_explain.log_nested_statements = on; SET auto_explain.log_format = json; "
    "SET client_min_messages = log"
)
AUTO_EXPLAIN_OFF = "RESET client_min_messages; SET auto_explain.log_min_duration = -1"


def explain_inside(what: str, matches, action) -> dict:
    """Run ``action``, rolled back; EXPLAIN ANALYZE the first statement that ``matches``.

    The statement is explained exactly as the engine sends it (same SQL, same
    parameters, same session settings), then sent again for real so the
    engine's code carries on as usual. The plans of the statements run inside
    functions it calls (the pick, ``controlplane_claimable_ids``) come from
    auto_explain, sent to this session as LOG notices, under ``"Nested"``.
    """
    from django.db import connection, transaction

    plans: list[dict] = []
    nested: list[dict] = []

    def collect(diagnostic) -> None:
        text = diagnostic.message_primary or ""
        if "{" in text:
            found = json.loads(text[text.index("{") :])
            query = found.get("Query Text", "")
            if not query.lstrip().upper().startswith(("EXPLAIN", "WITH ")):
                nested.append(found)

    def wrapper(execute, sql, params, many, context):
        if not many and not plans and matches(sql):
            raw_connection = context["connection"].connection
            context["cursor"].execute(AUTO_EXPLAIN_ON)
            raw_connection.add_notice_handler(collect)
            try:
                execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params, many, context)
                raw = context["cursor"].fetchone()[0]
            finally:
                raw_connection.remove_notice_handler(collect)
                context["cursor"].execute(AUTO_EXPLAIN_OFF)
            plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
            plan["Nested"] = nested
            plans.append(plan)
        return execute(sql, params, many, context)

    try:
        with transaction.atomic(), connection.execute_wrapper(wrapper):
            action()
            raise _Rollback
    except _Rollback:
        pass
    if not plans:
        raise RuntimeError(f"No {what} statement was sent.")
    return plans[0]


def print_plan(title: str, plan: dict) -> list[dict]:
    print(
        f"  {title}: planning {plan['Planning Time']:.2f} ms, "
        f"execution {plan['Execution Time']:.2f} ms"
    )
    nodes: list[dict] = []

    def walk(node: dict, depth: int) -> None:
        nodes.append(node)
        where = ""
        if node.get("Relation Name"):
            where += f" on {node['Relation Name']}"
        if node.get("Index Name"):
            where += f" using {node['Index Name']}"
        cond = node.get("Index Cond") or node.get("Hash Cond") or node.get("Recheck Cond") or ""
        print(
            f"    {'  ' * depth}{node['Node Type']}{where}  rows={node.get('Actual Rows')}"
            f" loops={node.get('Actual Loops')} time={node.get('Actual Total Time', 0):.2f} ms"
            f" buffers={node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)}"
            + (f"  [{cond}]" if cond else "")
        )
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(plan["Plan"], 0)
    for inner in plan.get("Nested", []):
        query = " ".join(inner.get("Query Text", "").split())
        print(f"    inside: {query[:110]}{'…' if len(query) > 110 else ''}")
        walk(inner["Plan"], 1)
    return nodes


def _by_primary_key(node: dict) -> bool:
    """An Index Scan on the job primary key, or a Bitmap Heap Scan fed only by it (``= ANY``)."""
    if node["Node Type"] == "Index Scan":
        return node.get("Index Name") == "controlplane_job_pkey"
    if node["Node Type"] == "Bitmap Heap Scan":
        children = node.get("Plans", [])
        return bool(children) and all(
            c["Node Type"] == "Bitmap Index Scan" and c.get("Index Name") == "controlplane_job_pkey"
            for c in children
        )
    return False


def _claimable_or_primary_key(nodes: list[dict]) -> bool:
    """The job table is read through an Index Scan on job_claimable_idx and key probes only."""
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "controlplane_job" and n["Node Type"] != "ModifyTable"
    ]
    pick = [n for n in scans if n.get("Index Name") == "job_claimable_idx"]
    return (
        bool(pick)
        and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in pick)
        and all(n in pick or _by_primary_key(n) for n in scans)
    )


def claim_plan_check(limit: int, title: str) -> bool:
    """Print the claim's plan; True when jobs are picked only through job_claimable_idx."""
    from jobs.claims import claim_jobs

    plan = explain_inside(
        "claim",
        lambda sql: "controlplane_claimable_ids" in sql and "'running'" in sql,
        lambda: claim_jobs(queues=[QUEUE], worker_id=uuid.uuid4(), limit=limit, lease_seconds=30),
    )
    nodes = print_plan(title, plan)
    pick = [n for n in nodes if n.get("Index Name") == "job_claimable_idx"]
    ok = _claimable_or_primary_key(nodes)
    verdict = (
        "an index range scan over claimable rows, then primary-key probes"
        if ok
        else "NOT an index range scan on job_claimable_idx plus primary-key probes"
    )
    print(f"    -> the claim is {verdict}")
    pages = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in pick)
    rows = sum(n.get("Actual Rows", 0) * n.get("Actual Loops", 1) for n in pick)
    # The pick descends job_claimable_idx once per priority lane and then reads
    # a page or two per 100 rows; far more means it walks rows it cannot claim.
    print(
        f"    -> job_claimable_idx: {pages} pages read in {len(pick)} scans ({rows} rows returned)"
    )
    return ok


def completion_plan_check(count: int, title: str) -> bool:
    """Print complete_jobs' plan for ``count`` claimed jobs; True when it probes by primary key."""
    from jobs.claims import Completion, claim_jobs, complete_jobs

    def action() -> None:
        jobs = claim_jobs(queues=[QUEUE], worker_id=uuid.uuid4(), limit=count, lease_seconds=30)
        complete_jobs([Completion(j.id, j.lease_token, {"pong": True}, None, 0) for j in jobs])

    nodes = print_plan(
        title,
        explain_inside(
            "completion",
            lambda sql: "UPDATE controlplane_job" in sql and "lease_token = NULL" in sql,
            action,
        ),
    )
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "controlplane_job" and "Scan" in n["Node Type"]
    ]
    ok = bool(scans) and all(n.get("Index Name") == "controlplane_job_pkey" for n in scans)
    print(
        "    -> the completion "
        + (
            "probes controlplane_job by primary key"
            if ok
            else "does NOT probe by primary key alone"
        )
    )
    return ok


def cycle_plan_check(count: int, title: str) -> bool:
    """Print the plan of the worker's one-statement cycle (complete ``count``, claim ``count``).

    True when ``controlplane_job`` is only reached through ``job_claimable_idx`` (the
    pick) and ``controlplane_job_pkey`` (the completions and the claimed rows).
    """
    from jobs.claims import Completion, claim_jobs, complete_and_claim

    def action() -> None:
        worker = uuid.uuid4()
        jobs = claim_jobs(queues=[QUEUE], worker_id=worker, limit=count, lease_seconds=30)
        complete_and_claim(
            [Completion(j.id, j.lease_token, {"pong": True}, None, 0) for j in jobs],
            queues=[QUEUE],
            worker_id=worker,
            limit=count,
            lease_seconds=30,
            local_operations=["ping"],
        )

    nodes = print_plan(
        title,
        explain_inside("cycle", lambda sql: sql.startswith("WITH done AS"), action),
    )
    ok = _claimable_or_primary_key(nodes)
    print(
        "    -> the cycle statement "
        + ("reads controlplane_job by claimable index and primary key only" if ok else "scans more")
    )
    return ok


def big_check(engine: EngineSystem, args, clean_drain_2: float | None) -> None:
    print(
        f"\n== Claim on a big table: {args.big:,} finished + "
        f"{args.big // 10:,} future-scheduled jobs =="
    )
    started = time.perf_counter()
    fill_big(engine, args.big, args.big // 10)
    print(f"  filled and analysed in {time.perf_counter() - started:.1f} s")
    engine.enqueue_bulk(args.jobs)
    k = engine.concurrency
    claim_ok = claim_plan_check(k, f"claim of {k}, {args.jobs:,} claimable")
    completion_ok = completion_plan_check(k, f"completion of {k}")
    cycle_ok = cycle_plan_check(k, f"one-statement cycle: complete {k}, claim {k}")
    engine.sql("DELETE FROM controlplane_jobevent")
    engine.sql("DELETE FROM controlplane_job WHERE status = 'queued' AND run_after <= now()")
    rates, cpus = [], []
    for attempt in range(1, BIG_DRAINS + 1):
        if attempt > 1:
            engine.sql("DELETE FROM controlplane_jobevent")  # the drain counts job.succeeded events
        drain, _ = engine.drain_live(args.jobs, 2, k, args.poll)
        rates.append(drain.rate)
        cpus.append(drain.extra.get("cpu ms/job", float("nan")))
        print(
            f"  drain {attempt}/{BIG_DRAINS} with 2 processes beside them: {drain.jobs:,} jobs "
            f"in {drain.seconds:.2f} s = {drain.rate:,.0f}/s"
            + "".join(f", {key} {value:.2f}" for key, value in drain.extra.items())
        )
    rate = median(rates)
    ratio = f" = {rate / clean_drain_2:.2f}x the clean-table median" if clean_drain_2 else ""
    print(
        f"  drain beside them, median of {BIG_DRAINS}: {rate:,.0f}/s{ratio}, "
        f"cpu ms/job {median(cpus):.2f}"
    )
    engine.enqueue_bulk(k * 4)
    claim_ok &= claim_plan_check(k, "claim after the drain, dead rows not vacuumed")
    completion_ok &= completion_plan_check(k, "completion after the drain, dead rows not vacuumed")
    cycle_ok &= cycle_plan_check(k, "one-statement cycle after the drain, dead rows not vacuumed")
    live, dead = engine.sql(
        "SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'controlplane_job'"
    )[0]
    print(
        f"  controlplane_job: {live:,} live and {dead:,} dead tuples; "
        f"autovacuum {engine.sql('SHOW autovacuum')[0][0]}"
    )
    print(f"  claim plan check: {'PASS' if claim_ok else 'FAIL'}")
    print(
        "  completion plan check: "
        + ("PASS" if completion_ok else "WARN: not by primary key (reads every running job)")
    )
    print(f"  cycle plan check: {'PASS' if cycle_ok else 'FAIL'}")


# --- report -------------------------------------------------------------------------------

ROWS = [
    ("enqueue_single", "enqueue, one per call (jobs/s)", True),
    ("enqueue_bulk", "enqueue, bulk x1000 (jobs/s)", True),
    ("enqueue_bulk_1tx", "enqueue, bulk x1000 in 1 tx (jobs/s)", True),
    ("drain_1", "drain, 1 process (jobs/s)", True),
    ("drain_2", "drain, 2 processes (jobs/s)", True),
    ("drain_4", "drain, 4 processes (jobs/s)", True),
    ("drain_1 cpu ms/job", "CPU per job, 1 process (ms)", False),
    ("drain_2 cpu ms/job", "CPU per job, 2 processes (ms)", False),
    ("pickup_p50", "pickup p50 (ms)", False),
    ("pickup_p95", "pickup p95 (ms)", False),
    ("idle_cpu", "idle worker, % of a core", False),
    ("ready_ms", "ready to claim: exec to start (ms)", False),
    ("ready_ms cpu", "  CPU by then (ms)", False),
    ("ready_line_ms", "  exec to readiness line (ms)", False),
    ("ready_ms pgq run", "ready to claim, pgq run (ms)", False),
    ("ready_ms pgq run cpu", "  CPU by then (ms)", False),
    ("cold_drain", "cold-start drain (jobs/s from exec)", True),
    ("cold_drain first start s", "  exec to first start (s)", False),
    ("cold_drain cpu ms/job", "  CPU per job, start-up in (ms)", False),
    ("cold_drain separate", "cold-start drain, separate execs", True),
    ("cold_drain separate first start s", "  exec to first start (s)", False),
    ("cold_drain separate cpu ms/job", "  CPU per job, start-up in (ms)", False),
]


def fmt(value: float | None, higher: bool) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:,.0f}" if higher else f"{value:.2f}"


def report(all_results: dict[str, dict[str, list[float]]], ours: list[str]) -> None:
    names = list(all_results)
    peers = [n for n in names if n not in ours]
    pairs = [(o, p) for o in ours for p in peers]
    print("\n== Medians over the runs ==")
    header = f"  {'metric':34}" + "".join(f"{n:>15}" for n in names)
    header += "".join(f"{o.split()[-1] + '/' + p[:5]:>12}" for o, p in pairs)
    print(header)
    for key, label, higher in ROWS:
        if not any(key in r for r in all_results.values()):
            continue
        line = f"  {label:34}"
        for name in names:
            line += f"{fmt(median(all_results[name].get(key, [])), higher):>15}"
        for o, p in pairs:
            theirs = median(all_results[p].get(key, []))
            mine = median(all_results[o].get(key, []))
            ratio = mine / theirs if theirs == theirs and theirs and mine == mine else float("nan")
            line += f"{'-' if ratio != ratio else f'{ratio:.2f}x':>12}"
        print(line)
    print(
        "  (ratios are ours / theirs: above 1 is better for rates, below 1 for latencies and CPU;"
    )
    print("   CPU per job counts the worker processes and their PostgreSQL backends)")
    for name in names:
        print(f"\n  all runs, {name}:")
        for key, values in all_results[name].items():
            print(
                f"    {key:32} "
                + ", ".join(f"{v:,.2f}" if v < 100 else f"{v:,.0f}" for v in values)
            )

    print("\n== Targets ==")
    for name in ours:
        mine = all_results[name]
        for key, (label, op, goal) in TARGETS.items():
            value = median(mine.get(key, []))
            if value != value:
                continue  # its phase did not run
            ok = {">=": value >= goal, "<=": value <= goal, "<": value < goal}[op]
            print(
                f"  {name:10} {label:26} {fmt(value, op == '>='):>10} {op} {goal:,.0f}  "
                + ("PASS" if ok else "FAIL")
            )
        if "pgqueuer" in all_results:
            value = median(mine.get("drain_2", [])) / median(
                all_results["pgqueuer"].get("drain_2", [float("nan")])
            )
            if value == value:
                print(
                    f"  {name:10} {'drain 2 proc / PGQueuer':26} {value:>10.2f} >= 1.5  "
                    + ("PASS" if value >= 1.5 else "FAIL")
                )
            cold = median(mine.get("cold_drain", [])) / median(
                all_results["pgqueuer"].get("cold_drain", [float("nan")])
            )
            if cold == cold:
                print(
                    f"  {name:10} {'cold-start drain / PGQueuer':26} {cold:>10.2f} >= 1.5  "
                    + ("PASS" if cold >= 1.5 else "FAIL")
                )


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (default 20,000)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--peers", action="store_true", help="also run Procrastinate and PGQueuer")
    parser.add_argument(
        "--big",
        type=int,
        default=1_000_000,
        help="finished jobs for the big-table claim check (0 skips it)",
    )
    parser.add_argument(
        "--concurrency",
        default="8,32",
        help="jobs at once per worker process (runworker --concurrency); "
        "a comma list measures our engine at each",
    )
    parser.add_argument("--processes", default="1,2,4", help="drains to run, by process count")
    parser.add_argument("--single", type=int, default=1000, help="jobs enqueued one per call")
    parser.add_argument("--pickup-samples", type=int, default=200)
    parser.add_argument(
        "--poll", type=float, default=2.0, help="worker poll interval during drains"
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="how long one idle worker's CPU is measured (0 skips it); it polls every --poll",
    )
    parser.add_argument(
        "--pickup-poll",
        type=float,
        default=5.0,
        help="worker poll interval during the pickup test (NOTIFY must wake it)",
    )
    parser.add_argument(
        "--slow-peer-jobs",
        type=int,
        default=5000,
        help="jobs per drain for Procrastinate (it drains at a few hundred per second)",
    )
    parser.add_argument(
        "--project",
        type=Path,
        default=BENCH_DIR.parent,
        help="the project to measure (a scratch copy for A/B runs)",
    )
    parser.add_argument(
        "--database",
        default="bench_engine",
        help="our database; the peers' are named after it (<name>_pgqueuer, ...)",
    )
    parser.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma list of the phases to run, of {','.join(PHASES)} (default: all)",
    )
    parser.add_argument(
        "--cold-execs", type=int, default=5, help="worker execs per ready-to-claim median"
    )
    parser.add_argument(
        "--cold-processes", type=int, default=2, help="fresh workers in the cold-start drain"
    )
    parser.add_argument(
        "--rollup",
        action="store_true",
        help="also drain with a reaper rolling up metrics beside the workers (issue 16: <= 5%%)",
    )
    args = parser.parse_args()
    args.phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    if args.phases - set(PHASES):
        parser.error(f"unknown phase(s): {', '.join(sorted(args.phases - set(PHASES)))}")
    process_counts = [int(p) for p in args.processes.split(",") if p.strip()]
    ks = [int(k) for k in args.concurrency.split(",") if k.strip()]

    engines = [EngineSystem(args.project.resolve(), args.database, k) for k in ks]
    if args.rollup:
        engines.append(EngineSystem(args.project.resolve(), args.database, ks[-1], rollup=True))
    engines[0].setup()
    systems: list[tuple[QueueSystem, int, list[int]]] = [
        (e, args.jobs, process_counts) for e in engines
    ]
    if args.peers:
        from peers.pgqueuer_peer import PGQueuerSystem
        from peers.procrastinate_peer import ProcrastinateSystem

        peer_counts = [p for p in process_counts if p <= 2]
        for peer, jobs in (
            (PGQueuerSystem(f"{args.database}_pgqueuer"), args.jobs),
            (ProcrastinateSystem(ks[0], f"{args.database}_procrastinate"), args.slow_peer_jobs),
        ):
            peer.setup()
            systems.append((peer, jobs, peer_counts))

    server = engines[0].sql("SELECT version()")[0][0].split(" on ")[0]
    print(
        f"{server}; {os.cpu_count()} CPUs; {args.jobs:,} jobs per drain, {args.runs} run(s); "
        f"our worker concurrency {args.concurrency}; worker logs in {LOG_DIR}"
    )
    results: dict[str, dict[str, list[float]]] = {s.name: {} for s, _, _ in systems}
    for run in range(1, args.runs + 1):
        print(f"\n== Run {run}/{args.runs} ==", flush=True)
        for system, jobs, counts in systems:
            run_system(system, args, results[system.name], process_counts=counts, jobs=jobs)
    report(results, [e.name for e in engines])
    if args.rollup:
        plain, rolled = results[engines[-2].name], results[engines[-1].name]
        print("\n== Drain with the metrics rollup beside it (median jobs/s, ratio to without) ==")
        for p in process_counts:
            key = f"drain_{p}"
            base, with_rollup = median(plain.get(key, [])), median(rolled.get(key, []))
            print(
                f"  {p} process(es): {base:,.0f} without, {with_rollup:,.0f} with: "
                f"{with_rollup / base:.3f} (goal >= 0.95)"
            )
    if args.big:
        engine = max(engines, key=lambda e: e.concurrency)
        big_check(engine, args, median(results[engine.name].get("drain_2", [])) or None)
    for system, _, _ in systems[len(engines) :]:
        system.close()


if __name__ == "__main__":
    main()
