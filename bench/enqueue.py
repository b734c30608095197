"""Enqueue throughput on PostgreSQL: one job per call and bulk ``enqueue_many``.

    .venv/bin/python bench/enqueue.py [--jobs N] [--runs 3] [--batch 1000] [--profile]

``DATABASE_URL`` selects the database (default
postgres://postgres@127.0.0.1:5432/bench_enqueue); it is created if missing
and migrated. Every run starts from empty job tables. Prints the median of
the runs in jobs/s.
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
            "TRUNCATE jobs_jobevent, jobs_batchmessage, jobs_batchreceipt, jobs_job CASCADE"
        )
        cursor.execute("VACUUM ANALYZE jobs_job")


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


def measure(name: str, func, n: int, batch: int, runs: int) -> float:
    from jobs.models import Job

    rates = []
    for run in range(1, runs + 1):
        empty_tables()
        elapsed = func(n, batch)
        assert Job.objects.count() == n, "not every job was stored"
        rates.append(n / elapsed)
        print(f"  {name} run {run}: {n} jobs in {elapsed:.3f} s = {n / elapsed:,.0f} jobs/s")
    median = statistics.median(rates)
    print(f"{name}: median {median:,.0f} jobs/s over {runs} runs")
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
    args = parser.parse_args()

    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    ensure_database(url)
    setup(url)
    single_n = args.single_jobs or max(1, args.jobs // 4)
    print(f"database {urlsplit(url)._replace(netloc=urlsplit(url).hostname or '').geturl()}")
    if not args.skip_single:
        measure("enqueue (one per call)", one_per_call, single_n, args.batch, args.runs)
    measure(f"enqueue_many (batches of {args.batch})", bulk, args.jobs, args.batch, args.runs)
    if args.profile:
        profile(args.jobs, args.batch)
    empty_tables()


if __name__ == "__main__":
    main()
