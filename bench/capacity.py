"""What one job costs one PostgreSQL primary: the inputs of docs/scaling.md.

    .venv/bin/python bench/capacity.py [--jobs 20000] [--runs 3] [--concurrency 32] [--processes 2]

PostgreSQL only, on the database's own machine (it reads ``/proc`` for the
backends' CPU and the server's ``pg_wal`` with ``pg_waldump``). Its own
database (``--database``, default ``capacity_bench``) is created fresh and
migrated. Each run, on emptied tables:

1. **enqueue, one per call** (``--single`` jobs through ``enqueue()``) and
   **enqueue, bulk** (``--jobs`` through ``enqueue_many`` in calls of 1,000);
2. **drain**: real ``runworker`` processes start idle on a paused queue, then
   the queue is resumed and they run every job (no-op ``ping``);
3. **vacuum** after the drain (what autovacuum would do for the claims'
   and completions' dead rows), the **table and index sizes** before and after,
   and compacted (``VACUUM FULL``: the history's own footprint);
4. **retention**: the reaper's ``delete_finished_jobs`` over every job, then
   the vacuum that follows it.

For every phase: the CPU of the PostgreSQL backends doing it (user + system
from ``/proc/<pid>/stat``), and the WAL it wrote. The server is shared, so
the WAL is attributed, not subtracted: ``pg_waldump`` reads the range between
two LSNs and only records that touch this database's relations, or belong to
a transaction that did, are counted (full-page images split out). Every
figure is per job, the median of ``--runs``; all runs are printed too.

``--connections`` also counts, from ``pg_stat_activity``, the connections a
worker (at each ``--conn-concurrency``, idle and at its peak running
``sleep`` jobs that emit), a ``--processes`` worker, a ``--poll-only`` worker
and a reaper hold. See docs/scaling.md for what the figures mean.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from engine import QUEUE, EngineSystem  # noqa: E402
from peers import LOG_DIR, WorkerGroup, cpu_seconds, median, python  # noqa: E402

TABLES = (
    "controlplane_job",
    "controlplane_jobevent",
    "controlplane_batchmessage",
    "controlplane_batchreceipt",
)
BLOCK = 8192
_RECORD = re.compile(r"len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+)")
_BLOCK_REF = re.compile(r"rel (\d+)/(\d+)/(\d+)")
_HOLE = re.compile(r"hole: offset: \d+, length: (\d+)")
_SAVED = re.compile(r"compression saved: (\d+)")


# --- WAL attribution ---------------------------------------------------------------------


@dataclass
class Wal:
    """WAL bytes of one phase that belong to this database."""

    total: int = 0
    fpi: int = 0
    records: int = 0
    seen: bool = False  # pg_waldump printed anything at all
    xids: int = 0  # transaction ids this database's records carry (what freezing must age out)
    by_relation: dict[str, int] = field(default_factory=dict)
    cluster: int = 0  # every byte written between the marks, by anyone


class WalMeter:
    """Marks LSNs and reads the range back with ``pg_waldump``, keeping this database's part."""

    def __init__(self, engine: EngineSystem) -> None:
        self.engine = engine
        self.db_oid = str(
            engine.sql("SELECT oid FROM pg_database WHERE datname = current_database()")[0][0]
        )
        self.wal_dir = Path(engine.sql("SHOW data_directory")[0][0]) / "pg_wal"
        bindir = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        found = Path(bindir) / "pg_waldump" if bindir else None
        self.waldump = str(found) if found and found.exists() else shutil.which("pg_waldump")
        if not self.waldump or not self.wal_dir.is_dir():
            raise SystemExit(
                "bench/capacity.py reads the server's WAL with pg_waldump: run it on the "
                f"database's machine with read access to {self.wal_dir}."
            )

    @property
    def slot(self) -> str:
        return f"capacity_bench_{os.getpid()}"

    def mark(self) -> str:
        """The current insert LSN, with WAL from here on kept until read.

        Others' checkpoints would recycle the segments of a long phase before
        ``pg_waldump`` reads them: a temporary physical replication slot
        (dropped with this session, even if the benchmark dies) holds them;
        ``since`` advances it past what it read.
        """
        held = self.engine.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [self.slot]
        )
        if not held:
            self.engine.sql(
                "SELECT pg_create_physical_replication_slot(%s, true, true)", [self.slot]
            )
        return self.engine.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]

    def since(self, start: str) -> Wal:
        end = self.mark()
        deadline = time.monotonic() + 30
        while self.engine.sql("SELECT pg_current_wal_flush_lsn() < %s::pg_lsn", [end])[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"WAL not flushed up to {end} after 30 s")
            time.sleep(0.05)
        cluster = self.engine.sql("SELECT %s::pg_lsn - %s::pg_lsn", [end, start])[0][0]
        # Streamed: while a neighbour bulk-loads, the range holds gigabytes of their WAL.
        dump = subprocess.Popen(
            [self.waldump, "-b", "-p", str(self.wal_dir), "-s", start, "-e", end],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert dump.stdout is not None
        wal = self._attribute(dump.stdout)
        stderr = dump.stderr.read() if dump.stderr else ""
        dump.wait()
        if not wal.seen:
            raise RuntimeError(f"pg_waldump read nothing from {start} to {end}: {stderr}")
        wal.cluster = int(cluster)
        self.engine.sql("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [self.slot, end])
        return wal

    def _attribute(self, lines: Iterable[str]) -> Wal:
        """Sum the records of this database, and the others (commits) of its transactions.

        One pass: records of other databases are only kept as sums per transaction id,
        added at the end for the ids that turned out to be ours.
        """
        names = self._relation_names()
        wal = Wal()
        by_relation: dict[str, int] = defaultdict(int)
        ours: set[int] = set()
        others: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])  # tx -> tot, fpi, n
        record: list | None = None  # [tx, tot, fpi, relfilenode of ours or None, locks]

        def close(rec: list | None) -> None:
            if rec is None:
                return
            tx, tot, fpi, rel, locks = rec
            if rel is None and not locks:
                if tx:
                    sums = others[tx]
                    sums[0], sums[1], sums[2] = sums[0] + tot, sums[1] + fpi, sums[2] + 1
                return
            if tx:
                ours.add(tx)
            wal.total, wal.fpi, wal.records = wal.total + tot, wal.fpi + fpi, wal.records + 1
            label = names.get(rel, f"relfilenode {rel}") if rel else "locks"
            by_relation[label] += tot

        for line in lines:
            wal.seen = True
            if line.startswith("rmgr:"):
                close(record)
                m = _RECORD.search(line)
                record = None
                if m:
                    locks = f" db {self.db_oid} " in line.rstrip("\n") + " "
                    record = [int(m.group(3)), int(m.group(2)), 0, None, locks]
            elif record is not None and line.lstrip().startswith("blkref"):
                ref = _BLOCK_REF.search(line)
                if not ref:
                    continue
                if "(FPW)" in line:
                    hole, saved = _HOLE.search(line), _SAVED.search(line)
                    record[2] += BLOCK - (int(hole.group(1)) if hole else 0)
                    record[2] -= int(saved.group(1)) if saved else 0
                if ref.group(2) == self.db_oid and record[3] is None:
                    record[3] = ref.group(3)
        close(record)
        for tx in ours & others.keys():
            tot, fpi, n = others[tx]
            wal.total, wal.fpi, wal.records = wal.total + tot, wal.fpi + fpi, wal.records + n
            by_relation["commit/other"] += tot
        wal.by_relation = dict(by_relation)
        wal.xids = len(ours)
        return wal

    def _relation_names(self) -> dict[str, str]:
        rows = self.engine.sql(
            "SELECT pg_relation_filenode(c.oid)::text, c.relname, t.relname "
            "FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid "
            "LEFT JOIN pg_class t ON t.oid = i.indrelid "
            "WHERE c.relname LIKE 'controlplane_%%' OR t.relname LIKE 'controlplane_%%' "
            "OR c.relname LIKE 'pg_toast_%%'"
        )
        return {
            node: (f"{table} (index {name})" if table else name)
            for node, name, table in rows
            if node
        }


# --- CPU of PostgreSQL backends ------------------------------------------------------------


class BackendCpu:
    """CPU seconds of this database's client backends (``own``: the driver's only)."""

    def __init__(self, engine: EngineSystem, *, own: bool) -> None:
        self.engine = engine
        self.own = own
        self.start = self._read()

    def _read(self) -> dict[int, float]:
        if self.own:
            pids = [self.engine.sql("SELECT pg_backend_pid()")[0][0]]
        else:
            pids = self.engine.backend_pids()
        return {pid: cpu_seconds(pid) for pid in pids}

    def used(self) -> float:
        now = self._read()
        return sum(value - self.start.get(pid, 0.0) for pid, value in now.items())


# --- phases --------------------------------------------------------------------------------


@dataclass
class Phase:
    """One measured phase: PostgreSQL CPU and WAL per job, and the client's CPU."""

    jobs: int
    db_cpu: float
    wal: Wal
    client_cpu: float = 0.0

    def row(self) -> dict[str, float]:
        n = self.jobs
        return {
            "db cpu us/job": self.db_cpu * 1e6 / n,
            "client/worker cpu us/job": self.client_cpu * 1e6 / n,
            "wal B/job": self.wal.total / n,
            "wal B/job without FPI": (self.wal.total - self.wal.fpi) / n,
            "cluster wal B/job": self.wal.cluster / n,
            "xids per 1000 jobs": self.wal.xids * 1000 / n,
        }


def measured(engine: EngineSystem, meter: WalMeter, jobs: int, action) -> Phase:
    """Run ``action`` in this process; its backend's CPU and the WAL since."""
    cpu = BackendCpu(engine, own=True)
    start, client = meter.mark(), time.process_time()
    action()
    client = time.process_time() - client
    return Phase(jobs, cpu.used(), meter.since(start), client)


def pause(paused: bool) -> None:
    from django_controlplane.api.actions import set_queue_paused

    set_queue_paused(QUEUE, paused)


def drain(engine: EngineSystem, meter: WalMeter, jobs: int, processes: int) -> Phase:
    """Workers start idle on the paused queue; resumed, they run every queued job.

    The "client" CPU of this phase is the worker processes' own (children included)."""
    group = engine.start_workers(processes, engine.concurrency, 2.0)
    try:
        cpu = BackendCpu(engine, own=False)
        workers = group.cpu([])
        start = meter.mark()
        pause(False)
        engine.wait_succeeded(jobs, group)
        used = cpu.used()
        worker_cpu = sum(v - workers.get(k, 0.0) for k, v in group.cpu([]).items())
        wal = meter.since(start)
    finally:
        group.stop()
    return Phase(jobs, used, wal, worker_cpu)


# The storage of a table: itself, or each leaf partition of a partitioned one
# (pg_partition_tree returns nothing for a plain table).
_LEAVES = (
    "SELECT c.oid FROM pg_class c WHERE c.oid = %s::regclass AND c.relkind IN ('r', 'i') "
    "UNION ALL SELECT relid FROM pg_partition_tree(%s::regclass) WHERE isleaf"
)


def sizes(engine: EngineSystem) -> dict[str, dict[str, int]]:
    """Heap (with TOAST), index and total bytes of each table over its partitions, and its rows."""
    found = {}
    for table in TABLES:
        heap, indexes, total = engine.sql(
            "SELECT sum(pg_table_size(oid)), sum(pg_indexes_size(oid)), "
            f"sum(pg_total_relation_size(oid)) FROM ({_LEAVES}) AS leaves",
            [table, table],
        )[0]
        rows = engine.sql(f"SELECT count(*) FROM {table}")[0][0]
        found[table] = {
            "heap": int(heap or 0),
            "indexes": int(indexes or 0),
            "total": int(total or 0),
            "rows": rows,
        }
    return found


def index_sizes(engine: EngineSystem, table: str) -> dict[str, int]:
    """Bytes of each index of ``table`` (a partitioned index: over its partitions)."""
    found = {}
    for (name,) in engine.sql(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass", [table]
    ):
        size = engine.sql(
            f"SELECT sum(pg_relation_size(oid)) FROM ({_LEAVES}) AS leaves", [name, name]
        )[0][0]
        found[name] = int(size or 0)
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def vacuum(engine: EngineSystem, full: bool = False) -> None:
    for table in TABLES:
        engine.sql(f"VACUUM {'(FULL) ' if full else ''}{table}")


def retention(by_delete: bool) -> None:
    """What the reaper's retention does once every job is past the cutoff.

    Partitioned events (PostgreSQL, `controlplane_partition_events`): the event partitions
    are dropped whole, then the job rows go by the batched DELETE. With
    ``by_delete`` (or a plain events table), the jobs and their events go
    by the batched DELETE alone.
    """
    from django.utils import timezone

    from jobs.conf import knob
    from jobs.partitions import (
        covered_ranges,
        event_partitions,
        is_partitioned,
        period,
        retire_partitions,
    )
    from workers.reaper import delete_finished_jobs

    size = int(knob("RETENTION_BATCH_SIZE"))
    partitioned = is_partitioned() and not by_delete
    # Past the end of every partition made ahead of now, so each one can go.
    ahead = period() * (int(knob("EVENT_PARTITIONS_AHEAD")) + 2)
    cutoff = timezone.now() + (ahead if partitioned else timedelta(days=1))
    covered: list = []
    if partitioned:
        while retire_partitions(cutoff).dropped:
            pass
        covered = covered_ranges(event_partitions())
    while (
        delete_finished_jobs(cutoff, size, covered=covered, covered_cutoff=cutoff - period())
        == size
    ):
        pass


def fresh_partitions() -> None:
    """The event partitions the reaper keeps made ahead (dropped by the last retention)."""
    from django.utils import timezone

    from jobs.partitions import ensure_partitions, is_partitioned

    if is_partitioned():
        ensure_partitions(timezone.now())


def one_run(engine: EngineSystem, meter: WalMeter, args) -> tuple[dict, dict]:
    """Every phase once; returns per-job figures by phase and the size snapshots."""
    figures: dict[str, Phase] = {}
    fresh_partitions()
    engine.reset()
    figures["enqueue, one per call"] = measured(
        engine, meter, args.single, lambda: engine.enqueue_single(args.single)
    )
    engine.reset()
    pause(True)
    figures["enqueue, bulk x1000"] = measured(
        engine, meter, args.jobs, lambda: engine.enqueue_bulk(args.jobs)
    )
    snapshots = {"queued": sizes(engine)}
    figures["drain (claim + complete)"] = drain(engine, meter, args.jobs, args.processes)
    events = engine.sql("SELECT count(*) FROM controlplane_jobevent")[0][0]
    snapshots["finished, not vacuumed"] = sizes(engine)
    figures["vacuum after drain"] = measured(engine, meter, args.jobs, lambda: vacuum(engine))
    snapshots["finished, vacuumed"] = sizes(engine)
    vacuum(engine, full=True)
    snapshots["finished, compacted"] = sizes(engine)
    snapshots["indexes"] = {t: index_sizes(engine, t) for t in TABLES[:2]}
    figures["retention"] = measured(
        engine, meter, args.jobs, lambda: retention(args.retention == "delete")
    )
    figures["vacuum after retention"] = measured(engine, meter, args.jobs, lambda: vacuum(engine))
    snapshots["events"] = events
    return figures, snapshots


# --- connections ---------------------------------------------------------------------------


def count_connections(engine: EngineSystem) -> int:
    return len(engine.backend_pids())


def backend_memory_mb(engine: EngineSystem) -> float:
    """Mean proportional set size (Pss: private pages plus a share of shared ones) of this
    database's client backends, in MB; shared_buffers is shared by all and mostly excluded."""
    sizes = []
    for pid in engine.backend_pids():
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        found = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
        if found:
            sizes.append(int(found.group(1)) / 1024)
    return sum(sizes) / len(sizes) if sizes else float("nan")


def watch_connections(
    engine: EngineSystem, argvs: list[list[str]], jobs: int, load=None
) -> tuple[int, int, float]:
    """Connections (idle, peak) of processes started from ``argvs``, and the mean MB per
    backend, while they run ``jobs`` (``sleep`` jobs that emit, so every job thread uses the
    database) or while ``load()`` runs."""
    # A heartbeat every 0.5 s, so its connection shows within the watch (it is kept once used).
    env = {**engine.worker_env(2.0), "CONTROLPLANE_HEARTBEAT_SECONDS": "0.5"}
    group = WorkerGroup("connections", argvs, env=env, cwd=engine.cwd)
    try:
        deadline = time.monotonic() + 60
        idle = 0
        while time.monotonic() < deadline:  # settled: the same count for one second
            group.check_alive()
            seen = count_connections(engine)
            time.sleep(1.0)
            if seen and seen == count_connections(engine):
                idle = seen
                break
        peak = idle
        if load is not None:
            worker = threading.Thread(target=load)
            worker.start()
            while worker.is_alive():
                peak = max(peak, count_connections(engine))
                time.sleep(0.05)
        if jobs:
            from jobs.enqueue import JobSpec, enqueue_many

            payload = {"seconds": 0.3, "emit_every": 0.1}
            enqueue_many([JobSpec("sleep", payload, queue=QUEUE) for _ in range(jobs)])
            pause(False)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                peak = max(peak, count_connections(engine))
                left = engine.sql(
                    "SELECT count(*) FROM controlplane_job WHERE status IN ('queued', 'running')"
                )[0][0]
                if not left:
                    break
                time.sleep(0.05)
        memory = backend_memory_mb(engine)
    finally:
        group.stop()
    return idle, peak, memory


def connections(engine: EngineSystem, args) -> list[tuple[str, int, int, float]]:
    base = [sys.executable, "manage.py", "runworker", "--queue", QUEUE]
    cases: list[tuple[str, list[list[str]], int]] = []
    for k in args.conn_concurrency:
        jobs = k * 4
        cases.append((f"runworker --concurrency {k}", [base + ["--concurrency", str(k)]], jobs))
    k = args.conn_concurrency[-1]
    cases.append(
        (
            f"runworker --concurrency {k} --poll-only",
            [base + ["--concurrency", str(k), "--poll-only"]],
            k * 4,
        )
    )
    cases.append(
        (
            f"runworker --concurrency {k} --processes 2",
            [base + ["--concurrency", str(k), "--processes", "2"]],
            k * 8,
        )
    )
    cases.append(("reaper", [[sys.executable, "manage.py", "reaper"]], 0))
    found = []
    for name, argvs, jobs in cases:
        engine.reset()
        pause(True)
        idle, peak, memory = watch_connections(engine, argvs, jobs)
        print(f"  {name:48} idle {idle:3}  peak {peak:3}  {memory:5.1f} MB each", flush=True)
        found.append((name, idle, peak, memory))
    port = free_port()
    serve = [sys.executable, "manage.py", "serve", "--processes", "1", "--no-collectstatic"]
    name = "serve --processes 1 (32 clients on GET /jobs)"
    idle, peak, memory = watch_connections(
        engine, [serve + ["--port", str(port)]], 0, load=lambda: web_load(port, api_token(), 32)
    )
    print(f"  {name:48} idle {idle:3}  peak {peak:3}  {memory:5.1f} MB each", flush=True)
    found.append((name, idle, peak, memory))
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def api_token() -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username="capacity-bench")
    return Token.objects.get_or_create(user=user)[0].key


def web_load(port: int, token: str, clients: int, requests: int = 20) -> None:
    """``clients`` threads each sending ``requests`` authenticated ``GET /jobs`` (after the
    server answers at all; a 503 under overload counts as an answer)."""
    url = f"http://127.0.0.1:{port}/jobs?limit=50"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the web server did not answer on port {port}") from None
            time.sleep(0.2)

    def client() -> None:
        for _ in range(requests):
            request = urllib.request.Request(url, headers={"Authorization": f"Token {token}"})
            try:
                urllib.request.urlopen(request, timeout=30).read()
            except urllib.error.HTTPError:
                pass

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# --- report --------------------------------------------------------------------------------


def report(runs: list[tuple[dict, dict]], args) -> None:
    print(
        f"\n== Per job: medians of {len(runs)} run(s) ({args.jobs:,} jobs; "
        f"{args.single:,} one per call; drain k{args.concurrency} x {args.processes} processes) =="
    )
    columns = list(runs[0][0]["drain (claim + complete)"].row())
    print(f"  {'phase':28}" + "".join(f"{c:>26}" for c in columns))
    totals = defaultdict(list)
    for phase in runs[0][0]:
        rows = [r[0][phase].row() for r in runs]
        cells = {c: median([row[c] for row in rows]) for c in columns}
        print(f"  {phase:28}" + "".join(f"{cells[c]:>26,.1f}" for c in columns))
        for c in columns:
            runs_of = ", ".join(f"{row[c]:,.1f}" for row in rows)
            print(f"  {'':28}   {c}: {runs_of}")
        if phase != "enqueue, one per call":
            for index, row in enumerate(rows):
                if len(totals["db"]) <= index:
                    totals["db"].append(0.0)
                    totals["wal"].append(0.0)
                totals["db"][index] += row["db cpu us/job"]
                totals["wal"][index] += row["wal B/job"]
    db, wal = median(totals["db"]), median(totals["wal"])
    print(
        f"\n  lifecycle (bulk enqueue + drain + both vacuums + retention): "
        f"{db:,.1f} us of PostgreSQL CPU and {wal:,.0f} B of WAL per job "
        f"-> {1e6 / db:,.0f} jobs/s per PostgreSQL core"
    )
    print("\n== WAL by relation, drain, last run (bytes per job) ==")
    drain_wal = runs[-1][0]["drain (claim + complete)"].wal
    for name, value in sorted(drain_wal.by_relation.items(), key=lambda kv: -kv[1]):
        print(f"  {name:64} {value / args.jobs:>10,.1f}")
    snaps = runs[-1][1]
    events = snaps["events"]
    print(f"\n== Sizes, last run ({args.jobs:,} jobs, {events:,} events) ==")
    for state in ("queued", "finished, not vacuumed", "finished, vacuumed", "finished, compacted"):
        for table in TABLES[:2]:
            unit = "job" if table == "controlplane_job" else "event"
            s = snaps[state][table]
            per = s["rows"] or 1
            print(
                f"  {state:24} {table:24} heap {s['heap'] / per:7.1f}  indexes "
                f"{s['indexes'] / per:7.1f}  total {s['total'] / per:7.1f} B/{unit}"
            )
    for table, found in snaps["indexes"].items():
        per = args.jobs if table == "controlplane_job" else events
        for name, size in found.items():
            print(f"  compacted index {name:44} {size / per:7.1f} B per row")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per bulk enqueue and drain")
    parser.add_argument("--single", type=int, default=2_000, help="jobs enqueued one per call")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="runworker --concurrency")
    parser.add_argument("--processes", type=int, default=2, help="runworker --processes")
    parser.add_argument(
        "--connections", action="store_true", help="also count connections per process"
    )
    parser.add_argument("--conn-concurrency", default="4,32", help="worker concurrencies to count")
    parser.add_argument("--skip-runs", action="store_true", help="only the connection counts")
    parser.add_argument(
        "--retention",
        choices=("partitions", "delete"),
        default="partitions",
        help="partitions: partition the events table first (controlplane_partition_events) and "
        "drop them as the reaper does; delete: a plain table, DELETE",
    )
    parser.add_argument("--database", default="capacity_bench")
    args = parser.parse_args()
    args.conn_concurrency = [int(k) for k in args.conn_concurrency.split(",") if k.strip()]

    engine = EngineSystem(BENCH_DIR.parent, args.database, args.concurrency)
    engine.setup()
    if args.retention == "partitions":
        subprocess.run(
            [python(), "manage.py", "controlplane_partition_events"], cwd=engine.cwd, check=True
        )
    meter = WalMeter(engine)
    server = engine.sql("SELECT version()")[0][0].split(" on ")[0]
    settings = dict(
        engine.sql(
            "SELECT name, setting FROM pg_settings WHERE name IN "
            "('synchronous_commit', 'full_page_writes', 'wal_compression', 'autovacuum', "
            "'checkpoint_timeout', 'max_wal_size', 'max_connections')"
        )
    )
    print(f"{server}; {os.cpu_count()} CPUs; {settings}; worker logs in {LOG_DIR}", flush=True)
    if args.connections:
        print("\n== Connections held (pg_stat_activity, this database) ==", flush=True)
        connections(engine, args)
    if args.skip_runs:
        return
    runs = []
    for run in range(1, args.runs + 1):
        print(f"\n== Run {run}/{args.runs} ==", flush=True)
        figures, snaps = one_run(engine, meter, args)
        for phase, fig in figures.items():
            row = fig.row()
            print(
                f"  {phase:28} db {row['db cpu us/job']:8.1f} us/job  "
                f"wal {row['wal B/job']:8.0f} B/job (FPI {fig.wal.fpi / fig.jobs:6.0f}; "
                f"whole cluster {row['cluster wal B/job']:8.0f})",
                flush=True,
            )
        runs.append((figures, snaps))
    report(runs, args)


if __name__ == "__main__":
    main()
