"""Enqueue throughput on PostgreSQL: one job per call and bulk ``enqueue_many``.

    .venv/bin/python bench/enqueue.py [--jobs N] [--runs 3] [--batch 1000] [--profile]
                                      [--floor] [--old-indexes]

``DATABASE_URL`` selects the database (default
postgres://postgres@127.0.0.1:5432/bench_enqueue); it is created if missing
and migrated. Every run starts from empty job tables. Prints the median of
the runs in jobs/s.

``--floor`` also times the same INSERT statement sent with plain psycopg
(documents built beforehand, untimed): what the database alone costs, the
ceiling for ``enqueue_many``. ``--old-indexes`` swaps the three partial
indexes of migration 0002 back to their 0001 full forms for the run (and
restores them after), to measure what the index tuning saved.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_enqueue"


def ensure_database(url: str) -> None:
    """Create the database named by ``url`` unless it exists."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")


def setup(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        sys.exit("This benchmark measures PostgreSQL; point DATABASE_URL at one.")
    call_command("migrate", verbosity=0)


def empty_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE controlplane_jobevent, controlplane_batchmessage, "
            "controlplane_batchreceipt, controlplane_job CASCADE"
        )
        cursor.execute("VACUUM ANALYZE controlplane_job")


def one_per_call(n: int, batch: int) -> float:
    from jobs.enqueue import enqueue

    started = time.perf_counter()
    for _ in range(n):
        enqueue("sleep", {"seconds": 0})
    return time.perf_counter() - started


def bulk(n: int, batch: int) -> float:
    from jobs.enqueue import JobSpec, enqueue_many

    started = time.perf_counter()
    for start in range(0, n, batch):
        size = min(batch, n - start)
        enqueue_many([JobSpec("sleep", {"seconds": 0}) for _ in range(size)])
    return time.perf_counter() - started


OLD_INDEXES = {
    "job_parent_idx": "(parent_id, status)",
    "job_finished_idx": "(status, finished_at)",
    "job_worker_idx": "(worker_id, status)",
}
NEW_INDEXES = {
    "job_parent_idx": "(parent_id, status) WHERE parent_id IS NOT NULL",
    "job_finished_idx": "(status, finished_at) WHERE finished_at IS NOT NULL",
    "job_worker_idx": "(worker_id) WHERE status = 'running'",
}


def swap_indexes(definitions: dict[str, str]) -> None:
    """Recreate the named Job indexes with ``definitions`` (the tables are empty here)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for name, definition in definitions.items():
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
            cursor.execute(f"CREATE INDEX {name} ON controlplane_job {definition}")


def psycopg_floor(n: int, batch: int) -> tuple[float, float]:
    """The enqueue statement alone: documents prepared untimed, one transaction per batch."""
    from django.db import connection
    from django.utils import timezone

    from jobs import enqueue as module
    from jobs.enqueue import JobSpec

    now = timezone.now()
    docs = []
    for start in range(0, n, batch):
        memo = module._Batch(1 << 20, now, min(batch, n - start))
        rows = [
            module._prepare(JobSpec("sleep", {"seconds": 0}), memo)[0]
            for _ in range(min(batch, n - start))
        ]
        docs.append((rows, module._rows_document(rows)))
    statement = module.POSTGRES_INSERT
    connection.ensure_connection()
    raw = connection.connection  # the psycopg connection itself, in autocommit mode
    started, cpu = time.perf_counter(), time.process_time()
    for _rows, doc in docs:
        raw.execute(statement, [now, now, doc, now, ["default"]])
    return time.perf_counter() - started, time.process_time() - cpu


def measure(name: str, func, n: int, batch: int, runs: int) -> float:
    from jobs.models import Job

    rates, cpus = [], []
    for run in range(1, runs + 1):
        empty_tables()
        cpu = time.process_time()
        elapsed = func(n, batch)
        cpu = time.process_time() - cpu
        if isinstance(elapsed, tuple):  # (wall, client CPU) of the timed part only
            elapsed, cpu = elapsed
        assert Job.objects.count() == n, "not every job was stored"
        rates.append(n / elapsed)
        cpus.append(cpu * 1e6 / n)
        print(
            f"  {name} run {run}: {n} jobs in {elapsed:.3f} s = {n / elapsed:,.0f} jobs/s, "
            f"client CPU {cpu * 1e6 / n:.1f} us/job"
        )
    median = statistics.median(rates)
    print(
        f"{name}: median {median:,.0f} jobs/s, client CPU {statistics.median(cpus):.1f} us/job "
        f"over {runs} runs"
    )
    return median


def profile(n: int, batch: int) -> None:
    empty_tables()
    profiler = cProfile.Profile()
    profiler.enable()
    bulk(n, batch)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("cumulative")
    stats.print_stats(30)
    print(out.getvalue())
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (bulk)")
    parser.add_argument(
        "--single-jobs",
        type=int,
        default=None,
        help="jobs per run one per call (default: --jobs / 4)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue_many call")
    parser.add_argument("--profile", action="store_true", help="cProfile one bulk run")
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--floor", action="store_true", help="time plain psycopg INSERTs too")
    parser.add_argument(
        "--old-indexes", action="store_true", help="measure with the 0001 (full) indexes"
    )
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    ensure_database(url)
    setup(url)
    single_n = args.single_jobs or max(1, args.jobs // 4)
    print(f"database {urlsplit(url)._replace(netloc=urlsplit(url).hostname or '').geturl()}")
    if args.old_indexes:
        swap_indexes(OLD_INDEXES)
        print("with the 0001 full job_parent_idx, job_finished_idx, job_worker_idx")
    try:
        run_all(args, single_n)
    finally:
        if args.old_indexes:
            swap_indexes(NEW_INDEXES)
    empty_tables()


def run_all(args: argparse.Namespace, single_n: int) -> None:
    if not args.skip_single:
        measure("enqueue (one per call)", one_per_call, single_n, args.batch, args.runs)
    measure(f"enqueue_many (batches of {args.batch})", bulk, args.jobs, args.batch, args.runs)
    if args.floor:
        measure(
            f"psycopg INSERT floor (batches of {args.batch})",
            psycopg_floor,
            args.jobs,
            args.batch,
            args.runs,
        )
    if args.profile:
        profile(args.jobs, args.batch)


if __name__ == "__main__":
    main()
