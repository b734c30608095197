"""Enqueue throughput and CPU per job on PostgreSQL, alone or beside PGQueuer.

    .venv/bin/python bench/enqueue.py [--jobs N] [--runs 3] [--batch 1000] [--profile]
                                      [--same-spec] [--floor] [--old-indexes] [--peers]
                                      [--no-prepare] [--pickup N] [--unanalyzed]
                                      [--peer-database NAME]

``DATABASE_URL`` selects the database (default
postgres://postgres@127.0.0.1:5432/bench_enqueue); it is created if missing
and migrated. Every run starts from empty job tables. The workload is
engine.py's: the no-op ``ping`` with ``{}`` on queue ``bench``; one job per
``enqueue()`` call (each its own transaction, autocommit) and
``enqueue_many`` in batches. Each figure is the median of the runs: jobs/s,
and CPU per job of this process and of its PostgreSQL backend (read from
/proc, so the server must run on this machine). On a shared machine the
rates move with the neighbours' load; the CPU per job much less.

``--peers`` runs PGQueuer's enqueue (asyncpg, one ``enqueue`` call per job,
then lists of 1,000) in the same run, interleaved with ours run by run, and
prints our figures as ratios to theirs. ``--no-prepare`` measures ours with
``CONTROLPLANE["PREPARED_STATEMENTS"] = False`` (as behind PgBouncer in
transaction mode). ``--floor`` also times the same INSERT statement sent with
plain psycopg (documents built beforehand, untimed). ``--old-indexes`` swaps
the three partial indexes of migration 0002 back to their 0001 full forms for
the run (and restores them after), to measure what the index tuning saved.

``--unanalyzed`` empties the tables (ours and PGQueuer's) by TRUNCATE
alone. By default they are also VACUUM ANALYZEd, which records them as
empty; with autovacuum off, as on the benchmark server, nothing corrects
that during a run. That used to cost our enqueue dearly: the check of the
stored ``job.enqueued`` event's foreign key kept, per session, a plan made
on a one-page job table (a sequential scan of the growing table, about 55 us
of server CPU per job at 2,000 jobs). Since that event is implied by the job
row (``jobs.timeline``) an enqueue checks no foreign key, and both ways of
emptying give the same figures.

``--pickup N`` splits the pickup latency of N jobs (one real ``runworker``,
idle, woken by NOTIFY; one job at a time) into the ``enqueue()`` call, the
moment a bare ``LISTEN`` connection in this process sees the NOTIFY, and the
worker's claim (the ``job.started`` event's ``ts``: its transaction's start).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_enqueue"
QUEUE = "bench"

from peers import cpu_seconds  # noqa: E402


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


# Whether emptied tables are analyzed (both systems). Analyzed empty, with autovacuum off (as
# on the benchmark server), a table's statistics say "empty" for the whole run: a plan made
# then is kept (see --unanalyzed). TRUNCATE alone leaves them unknown, as after migrate.
ANALYZE_EMPTIED = True


def empty_tables() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE controlplane_jobevent, controlplane_batchmessage, "
            "controlplane_batchreceipt, controlplane_job CASCADE"
        )
        if ANALYZE_EMPTIED:
            cursor.execute("VACUUM ANALYZE controlplane_job")


def backend_pid() -> int:
    from django.db import connection

    connection.ensure_connection()
    return connection.connection.info.backend_pid


def one_per_call(n: int, batch: int) -> float:
    from jobs.enqueue import enqueue

    started = time.perf_counter()
    for _ in range(n):
        enqueue("ping", {}, queue=QUEUE)
    return time.perf_counter() - started


# --same-spec: bulk calls pass one spec repeated (``[JobSpec(...)] * 1000``, issue 32's form)
# instead of a new JobSpec per job.
SAME_SPEC = False


def bulk(n: int, batch: int) -> float:
    from jobs.enqueue import JobSpec, enqueue_many

    started = time.perf_counter()
    for start in range(0, n, batch):
        size = min(batch, n - start)
        if SAME_SPEC:
            enqueue_many([JobSpec("ping", {}, queue=QUEUE)] * size)
        else:
            enqueue_many([JobSpec("ping", {}, queue=QUEUE) for _ in range(size)])
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
    from jobs.enqueue_statement import statement

    try:  # the row builder's home since enqueue was split; before, private names in enqueue
        from jobs.job_spec import SpecBatch, prepare_row
    except ImportError:
        SpecBatch, prepare_row = module._Batch, module._prepare  # an older --project
    now = timezone.now()
    docs = []
    for start in range(0, n, batch):
        memo = SpecBatch(1 << 20, now, min(batch, n - start))
        rows = [
            prepare_row(JobSpec("ping", {}, queue=QUEUE), memo)[0]
            for _ in range(min(batch, n - start))
        ]
        docs.append(statement(rows, now))
    connection.ensure_connection()
    raw = connection.connection  # the psycopg connection itself, in autocommit mode
    started, cpu = time.perf_counter(), time.process_time()
    for text, params in docs:
        raw.execute(text, params)
    return time.perf_counter() - started, time.process_time() - cpu


class Figures:
    """Rates and CPU per job of one measured thing over the runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.rates: list[float] = []
        self.client: list[float] = []
        self.server: list[float] = []

    def add(self, n: int, wall: float, client: float, server: float) -> None:
        self.rates.append(n / wall)
        self.client.append(client * 1e6 / n)
        self.server.append(server * 1e6 / n)
        print(
            f"  {self.name}: {n} jobs in {wall:.3f} s = {n / wall:,.0f} jobs/s, CPU per job "
            f"{client * 1e6 / n:.1f} us client + {server * 1e6 / n:.1f} us server",
            flush=True,
        )

    def medians(self) -> tuple[float, float, float]:
        return (
            statistics.median(self.rates),
            statistics.median(self.client),
            statistics.median(self.server),
        )

    def line(self) -> str:
        rate, client, server = self.medians()
        return (
            f"{self.name:44} {rate:>10,.0f}/s  CPU {client + server:7.1f} us/job "
            f"({client:.1f} client + {server:.1f} server)"
        )


def measure_ours(figures: Figures, func: Callable, n: int, batch: int) -> None:
    from jobs.models import Job

    empty_tables()
    pid = backend_pid()
    server = cpu_seconds(pid)
    cpu = time.process_time()
    elapsed = func(n, batch)
    cpu = time.process_time() - cpu
    if isinstance(elapsed, tuple):  # (wall, client CPU) of the timed part only
        elapsed, cpu = elapsed
    server = cpu_seconds(pid) - server
    assert Job.objects.count() == n, "not every job was stored"
    figures.add(n, elapsed, cpu, server)


def measure(name: str, func, n: int, batch: int, runs: int) -> Figures:
    figures = Figures(name)
    for _ in range(runs):
        measure_ours(figures, func, n, batch)
    print(figures.line())
    return figures


class PGQueuerEnqueue:
    """PGQueuer's own enqueue calls (bench/peers/pgqueuer_peer.py), timed like ours."""

    def __init__(self, database: str) -> None:
        from peers.pgqueuer_peer import PGQueuerSystem

        self.system = PGQueuerSystem(database=database)
        self.system.setup()
        self.pid = self.system._run(self._pid())

    async def _pid(self) -> int:
        return self.system.conn.get_server_pid()

    def measure(self, figures: Figures, n: int, bulk: bool, batch: int) -> None:
        self.system.reset()
        if ANALYZE_EMPTIED:
            self.system.sql.execute("VACUUM ANALYZE pgqueuer")
        server = cpu_seconds(self.pid)
        cpu = time.process_time()
        started = time.perf_counter()
        if bulk:
            self.system.enqueue_bulk(n, batch)
        else:
            self.system.enqueue_single(n)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        stored = self.system.sql.execute("SELECT count(*) FROM pgqueuer").fetchone()[0]
        assert stored == n, "not every PGQueuer job was stored"
        figures.add(n, wall, cpu, cpu_seconds(self.pid) - server)

    def close(self) -> None:
        self.system.close()


def compare(args: argparse.Namespace, single_n: int) -> None:
    """Ours and PGQueuer's enqueue, interleaved run by run (the order alternates)."""
    peer = PGQueuerEnqueue(args.peer_database)
    kinds = [] if args.skip_single else [("one per call", False, single_n)]
    kinds.append((f"bulk x{args.batch}", True, args.jobs))
    table: list[tuple[Figures, Figures]] = []
    for label, is_bulk, n in kinds:
        ours, theirs = Figures(f"ours, {label}"), Figures(f"pgqueuer, {label}")
        func = bulk if is_bulk else one_per_call
        for run in range(args.runs):
            order = [0, 1] if run % 2 == 0 else [1, 0]
            for which in order:
                if which == 0:
                    measure_ours(ours, func, n, args.batch)
                else:
                    peer.measure(theirs, n, is_bulk, args.batch)
        table.append((ours, theirs))
    peer.close()
    print(f"\n== Medians of {args.runs} runs, ours and PGQueuer interleaved ==")
    for ours, theirs in table:
        print(ours.line())
        print(theirs.line())
        (rate, client, server), (their_rate, their_client, their_server) = (
            ours.medians(),
            theirs.medians(),
        )
        print(
            f"  -> rate {rate / their_rate:.2f}x PGQueuer's; "
            f"CPU per job {(client + server) / (their_client + their_server):.2f}x theirs"
        )


def pickup_split(samples: int, warmup: int = 5) -> None:
    """Where pickup latency goes: enqueue call, NOTIFY arrival, claim start (see the docstring)."""
    import psycopg
    from django.db import connection

    from jobs.enqueue import enqueue
    from jobs.wakeups import NOTIFY_CHANNEL

    queue = "pickup"
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM controlplane_worker")
    empty_tables()
    arrivals: list[float] = []
    listening = threading.Event()

    def listen() -> None:
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context", "prepare_threshold", "server_side_binding"):
            params.pop(key, None)
        with psycopg.connect(autocommit=True, **params) as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            listening.set()
            for _ in conn.notifies():
                arrivals.append(time.time())

    threading.Thread(target=listen, daemon=True).start()
    listening.wait(10)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--queue", queue, "--concurrency", "8"],
        cwd=ROOT,
        env={**os.environ, "CONTROLPLANE_POLL_SECONDS": "5"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rows: list[tuple[float, float, float, float]] = []
    try:
        deadline = time.monotonic() + 90
        while not _count("SELECT count(*) FROM controlplane_worker"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start")
            time.sleep(0.1)
        time.sleep(1.0)  # its LISTEN connection settles
        for index in range(samples + warmup):
            seen = len(arrivals)
            called = time.time()
            job = enqueue("ping", {}, queue=queue)
            returned = time.time()
            started = _started(job.id)
            note = next((t for t in arrivals[seen:] if t >= called), float("nan"))
            if index >= warmup:
                rows.append((returned - called, note - called, started - note, started - called))
            time.sleep(0.02)  # the worker is idle again before the next job
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    names = (
        "enqueue() call (validate, INSERT, commit)",
        "call -> NOTIFY seen by a bare listener",
        "NOTIFY seen -> the worker's claim starts",
        "call -> claim starts (pickup)",
    )
    print(f"pickup split over {len(rows)} jobs (ms):")
    for column, name in enumerate(names):
        values = sorted(r[column] * 1000 for r in rows if r[column] == r[column])
        p50, p95 = values[len(values) // 2], values[int(len(values) * 0.95)]
        print(f"  {name:44} p50 {p50:7.2f}  p95 {p95:7.2f}")


def _count(statement: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchone()[0]


def _started(job_id: object, timeout: float = 30.0) -> float:
    """The ``ts`` of the job's ``job.started`` event (epoch seconds), waited for."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT ts FROM controlplane_jobevent WHERE job_id = %s AND event = 'job.started'",
                [job_id],
            )
            row = cursor.fetchone()
        if row:
            return row[0].timestamp()
        if time.monotonic() > deadline:
            raise RuntimeError("a job was not picked up in time")
        time.sleep(0.002)


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
    parser.add_argument(
        "--same-spec",
        action="store_true",
        help="bulk calls repeat one JobSpec ([spec] * 1000) instead of making one per job",
    )
    parser.add_argument("--skip-single", action="store_true")
    parser.add_argument("--floor", action="store_true", help="time plain psycopg INSERTs too")
    parser.add_argument("--peers", action="store_true", help="PGQueuer's enqueue, interleaved")
    parser.add_argument(
        "--unanalyzed",
        action="store_true",
        help="empty the tables by TRUNCATE alone, not VACUUM ANALYZE (ours and PGQueuer's): "
        "an analyzed empty job table made the stored enqueue event's foreign-key check a "
        "sequential scan; that event is now implied, so this should change nothing",
    )
    parser.add_argument(
        "--peer-database",
        default="enqueue_bench_pgqueuer",
        help="PGQueuer's database for --peers (created if missing)",
    )
    parser.add_argument(
        "--pickup", type=int, default=0, metavar="N", help="split the pickup latency of N jobs"
    )
    parser.add_argument(
        "--no-prepare",
        action="store_true",
        help="ours without server-side prepared statements (PgBouncer transaction mode)",
    )
    parser.add_argument(
        "--old-indexes", action="store_true", help="measure with the 0001 (full) indexes"
    )
    args = parser.parse_args()

    global ANALYZE_EMPTIED, SAME_SPEC
    ANALYZE_EMPTIED = not args.unanalyzed
    SAME_SPEC = args.same_spec
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    ensure_database(url)
    setup(url)
    if args.no_prepare:
        from django.conf import settings

        settings.CONTROLPLANE = {
            **getattr(settings, "CONTROLPLANE", {}),
            "PREPARED_STATEMENTS": False,
        }
    single_n = args.single_jobs or max(1, args.jobs // 4)
    print(f"database {urlsplit(url)._replace(netloc=urlsplit(url).hostname or '').geturl()}")
    if args.old_indexes:
        swap_indexes(OLD_INDEXES)
        print("with the 0001 full job_parent_idx, job_finished_idx, job_worker_idx")
    try:
        if args.pickup:
            pickup_split(args.pickup)
        elif args.peers:
            compare(args, single_n)
        else:
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
