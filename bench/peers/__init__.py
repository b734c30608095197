"""What every queue under benchmark shares: the measuring protocol and its helpers.

A ``QueueSystem`` knows how to enqueue no-op jobs, how to start its real
worker processes, and how to read its own timestamps back. The protocol
(enqueue, drain, pickup) lives here once, so our engine and its peers are
measured the same way, against the same PostgreSQL, in the same run.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg

ADMIN_DSN = os.environ.get("BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
LOG_DIR = Path(tempfile.mkdtemp(prefix="bench-engine-"))


def dsn_for(database: str) -> str:
    base = ADMIN_DSN.rsplit("/", 1)[0]
    return f"{base}/{database}"


def ensure_database(name: str, *, fresh: bool = False) -> None:
    """Create ``name`` on the benchmark server unless it exists (``fresh``: drop it first)."""
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not found:
            conn.execute(f'CREATE DATABASE "{name}"')


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


DRIVER_NAME = "bench-driver"  # application_name of the benchmark's own connections
BACKENDS_SQL = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    f"AND backend_type = 'client backend' AND application_name <> '{DRIVER_NAME}'"
)
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def descendants(pid: int) -> list[int]:
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += descendants(int(child))
    return found


@dataclass
class DrainResult:
    jobs: int
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


class WorkerGroup:
    """Real worker processes started by the benchmark; stopped by their own pids."""

    def __init__(
        self, name: str, argvs: list[list[str]], *, env: dict[str, str], cwd: Path
    ) -> None:
        self.cpu_marks: dict[int, float] = {}
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        for index, argv in enumerate(argvs):
            log = LOG_DIR / f"{name}-{int(time.time() * 1000)}-{index}.log"
            handle = log.open("wb")
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env={**os.environ, **env},
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            handle.close()

    def cpu(self, backends: list[int]) -> dict[tuple[str, int], float]:
        """CPU seconds of every worker process (children included) and of ``backends``."""
        workers = [("worker", p) for proc in self.procs for p in descendants(proc.pid)]
        return {key: cpu_seconds(key[1]) for key in workers + [("db", pid) for pid in backends]}

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"A worker exited early (code {proc.returncode}); log {log}:\n{tail}"
                )

    def stop(self, timeout: float = 40.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we started, by its id
                proc.wait()


@dataclass
class ColdStart:
    """One worker exec'd beside a waiting job."""

    seconds: float  # from exec to that job's start, as the system recorded it
    cpu: float  # CPU seconds (user + system) the worker process had used by then
    ready_line: float | None = None  # seconds from exec to its readiness line, if it prints one


class QueueSystem:
    """One queue implementation under benchmark. Subclasses fill in the hooks."""

    name = "?"
    concurrency = 8
    cwd: Path = Path.cwd()
    cold_start = False  # measure the cold-start phases (``first_started_at`` is needed)

    # --- hooks -------------------------------------------------------------
    def setup(self) -> None: ...
    def reset(self) -> None: ...
    def enqueue_single(self, n: int) -> None: ...
    def enqueue_bulk(self, n: int, chunk: int = 1000) -> None: ...
    def enqueue_for_drain(self, n: int) -> None:
        """Make ``n`` jobs visible to running workers at once (one commit if possible)."""
        self.enqueue_bulk(n)

    def worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]: ...
    def worker_env(self, poll: float) -> dict[str, str]:
        return {}

    def workers_ready(self, group: WorkerGroup, processes: int) -> bool: ...
    def succeeded_count(self) -> int: ...
    def backend_pids(self) -> list[int]:
        """PostgreSQL backends of this system's database other than the benchmark's own."""
        return []

    def drain_window(self) -> tuple[int, datetime | None, datetime | None]:
        """(succeeded jobs, first start, last success) from the system's own records."""

    def drain_extra(self) -> dict[str, float]:
        return {}

    def first_started_at(self) -> datetime | None:
        """When the first job started, from the system's own records (None before)."""

    def fresh_worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]:
        """``processes`` separate worker execs, as an autoscaler adding containers starts them."""
        return self.worker_argvs(processes, concurrency, poll)

    def ready_variants(self, poll: float) -> dict[str, list[str] | None]:
        """Ways to start one worker for the ready-to-claim figure, by label ("": the usual)."""
        return {"": None}

    def ready_line_at(self, log: str) -> float | None:
        """The epoch time of the worker's readiness line in its ``log``, if it prints one."""
        return None

    def enqueue_one(self) -> object: ...
    def started_latency(self, handle: object) -> float | None:
        """Seconds from enqueue to start for ``handle``, or None while not started."""

    def finished(self, handle: object) -> bool: ...
    def close(self) -> None: ...

    # --- protocol --------------------------------------------------------------
    def start_workers(self, processes: int, concurrency: int, poll: float) -> WorkerGroup:
        group = WorkerGroup(
            f"{self.name}-p{processes}",
            self.worker_argvs(processes, concurrency, poll),
            env=self.worker_env(poll),
            cwd=self.cwd,
        )
        deadline = time.monotonic() + 90
        while not self.workers_ready(group, processes):
            group.check_alive()
            if time.monotonic() > deadline:
                group.stop()
                raise RuntimeError(f"{self.name}: workers not ready after 90 s (logs in {LOG_DIR})")
            time.sleep(0.1)
        time.sleep(1.0)  # let LISTEN connections settle
        return group

    def wait_succeeded(
        self, expected: int, group: WorkerGroup, *, stall_seconds: float = 60.0
    ) -> None:
        last, last_change = -1, time.monotonic()
        while True:
            done = self.succeeded_count()
            if done >= expected:
                return
            if done != last:
                last, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > stall_seconds:
                raise RuntimeError(
                    f"{self.name}: stalled at {done}/{expected} jobs (logs in {LOG_DIR})"
                )
            group.check_alive()
            time.sleep(0.2)

    def timed(self, fn, *args) -> float:
        started = time.perf_counter()
        fn(*args)
        return time.perf_counter() - started

    def drain_live(
        self, n: int, processes: int, concurrency: int, poll: float
    ) -> tuple[DrainResult, float]:
        """Workers are up and idle; ``n`` jobs appear at once. Returns drain and enqueue seconds."""
        group = self.start_workers(processes, concurrency, poll)
        try:
            before = group.cpu(self.backend_pids())
            seconds = self.timed(self.enqueue_for_drain, n)
            self.wait_succeeded(n, group)
            after = group.cpu(self.backend_pids())
        finally:
            group.stop()
        return self._result(before, after), seconds

    def _result(self, before: dict, after: dict) -> DrainResult:
        count, first, last = self.drain_window()
        seconds = (last - first).total_seconds() if first and last else float("nan")
        extra = self.drain_extra()
        if count:
            # Worker processes and their PostgreSQL backends: figures the
            # neighbours' load disturbs far less than wall-clock rates.
            used = {"worker": 0.0, "db": 0.0}
            for key, value in after.items():
                used[key[0]] += value - before.get(key, 0.0)
            extra["cpu ms/job"] = (used["worker"] + used["db"]) * 1000 / count
            extra["worker cpu ms/job"] = used["worker"] * 1000 / count
            extra["db cpu ms/job"] = used["db"] * 1000 / count
        return DrainResult(count, seconds, extra)

    def idle_cpu(self, seconds: float, concurrency: int, poll: float) -> float:
        """Percent of one core that one idle worker and its backends use, over ``seconds``."""
        group = self.start_workers(1, concurrency, poll)
        try:
            before, started = group.cpu(self.backend_pids()), time.monotonic()
            time.sleep(seconds)
            after, elapsed = group.cpu(self.backend_pids()), time.monotonic() - started
        finally:
            group.stop()
        used = sum(value - before.get(key, 0.0) for key, value in after.items())
        return used * 100 / elapsed

    def ready_to_claim(
        self, concurrency: int, poll: float, argv: list[str] | None = None
    ) -> ColdStart:
        """Exec one worker beside one waiting job; time from exec to that job's start.

        The start is the system's own timestamp (same clock: same machine), so
        the figure covers interpreter start, imports, set-up, connecting and
        the first claim, whatever each system logs or not along the way.
        """
        self.reset()
        self.enqueue_bulk(1)
        argvs = [argv] if argv else self.fresh_worker_argvs(1, concurrency, poll)
        exec_at = time.time()
        group = WorkerGroup(f"{self.name}-ready", argvs, env=self.worker_env(poll), cwd=self.cwd)
        try:
            deadline = time.monotonic() + 60
            while (started := self.first_started_at()) is None:
                group.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: no job started 60 s after exec")
                time.sleep(0.005)
            cpu = sum(cpu_seconds(p) for proc in group.procs for p in descendants(proc.pid))
        finally:
            group.stop()
        line = self.ready_line_at(group.logs[0].read_text(errors="replace"))
        return ColdStart(
            started.timestamp() - exec_at, cpu, None if line is None else line - exec_at
        )

    def cold_drain(self, n: int, argvs: list[list[str]], poll: float) -> DrainResult:
        """``n`` jobs wait; workers start (``argvs``): from their exec to the last success.

        CPU per job counts everything the workers used from exec on, start-up included.
        """
        self.reset()
        self.enqueue_for_drain(n)
        exec_at = time.time()
        group = WorkerGroup(f"{self.name}-cold", argvs, env=self.worker_env(poll), cwd=self.cwd)
        try:
            self.wait_succeeded(n, group)
            used = group.cpu(self.backend_pids())
        finally:
            group.stop()
        window = self._result({}, used)
        _, first, last = self.drain_window()
        extra = {"first start s": first.timestamp() - exec_at, **window.extra}
        return DrainResult(window.jobs, last.timestamp() - exec_at, extra)

    def pickup(self, samples: int, concurrency: int, poll: float, warmup: int = 5) -> list[float]:
        """Latencies (ms) from enqueue to start with one idle worker, one job at a time."""
        group = self.start_workers(1, concurrency, poll)
        latencies: list[float] = []
        try:
            for index in range(samples + warmup):
                handle = self.enqueue_one()
                deadline = time.monotonic() + max(10.0, poll * 3)
                latency = None
                while latency is None:
                    latency = self.started_latency(handle)
                    if latency is None:
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"{self.name}: a job was not picked up in time")
                        time.sleep(0.002)
                while not self.finished(handle) and time.monotonic() < deadline:
                    time.sleep(0.002)
                if index >= warmup:
                    latencies.append(latency * 1000)
                time.sleep(0.02)  # the worker is idle again before the next job
        finally:
            group.stop()
        return latencies


def python() -> str:
    return sys.executable
