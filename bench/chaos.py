"""The chaos soak: throughput under kill -9 and cut sessions, as a share of a calm run.

    .venv/bin/python bench/chaos.py [--jobs 5000] [--restart-postgres] [--skew SECONDS]
                                    [--knob NAME=VALUE …]

Two phases on the same jobs, workers and knobs, in one invocation:

1. **calm**: ``--workers`` real ``runworker`` processes and one ``reaper``
   drain ``--jobs`` jobs (the chaos test's mix: short sleeps, pings, and
   ``test.exactly_once``, an atomic operation writing one row with its success);
2. **chaos**: the same, while a random worker gets ``kill -9`` every
   ``--kill-every`` seconds (a replacement is started each time), every
   session of the database is cut once (``pg_terminate_backend``) at 40 %,
   and, only with ``--restart-postgres``, the PostgreSQL server restarts at
   60 % (``pg_ctlcluster … main restart``: it stops every other database on
   the server too, so never on a shared server without saying so).

It prints the chaos throughput as a ratio of the calm one (issue 13's goal:
>= 0.9 with the default lease), what the chaos cost (how long a killed
worker's jobs waited for the reaper, how long a replacement took to serve),
and the invariants of ``tests/integration/engine/test_chaos.py``: stuck
(not terminal), lost (not succeeded), succeeded twice, seq gaps, atomic side
effects not exactly once. The knobs are the product's defaults (lease 30 s,
reaper every 30 s) unless ``--knob`` overrides one.

With ``--skew S`` both phases run with skewed wall clocks, as in
``bench/clock_skew.py`` (Debian's libfaketime, the monotonic clock left
alone): the workers alternate S slow and S fast (a replacement takes the
next sign in turn), the reaper runs S fast; with ``--supervised`` the
supervisor and so all its children run S slow. This process keeps the true
clock. Per phase it also prints what a skew costs (with or without
``--skew``, for the comparison): lease rescues
(``job.lease_expired_requeue`` / ``job.lease_expired``) of jobs whose worker
was alive (the pid of the ``job.started`` before the rescue, neither killed
here nor exited), jobs failed, and timelines whose seq order is not their
time order (``created_at``, then every event's ``ts``).

PostgreSQL only (``BENCH_ADMIN_DSN``, default
``postgresql://postgres@127.0.0.1:5432/postgres``); the database
``--database`` (default ``bench_chaos``) is dropped and created afresh.
See bench/README.md for figures.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PROJECT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(PROJECT))

from clock_skew import FAKETIME_LIB, skewed  # noqa: E402
from peers import LOG_DIR, dsn_for, ensure_database, python  # noqa: E402

QUEUE = "default"
OPERATION_MODULES = "jobs.diagnostics,jobs.tasks_backend,tests.ops"
TERMINATE_AT = 0.4
RESTART_AT = 0.6


class Proc:
    """A ``manage.py`` command as a real process, its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], name: str) -> None:
        self.args = args
        self.log_path = LOG_DIR / f"{name}.log"
        self.spawned = time.monotonic()
        self.serving_after: float | None = None  # seconds from spawn to ``worker.started``
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                [python(), str(PROJECT / "manage.py"), *args],
                cwd=PROJECT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL (this process, by its pid) if it has not exited in time."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    jobs: int
    seconds: float = float("nan")
    kills: int = 0
    postponed: int = 0
    sessions_terminated: int | None = None
    restarted: bool = False
    serving_after: list[float] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    rescues: dict[str, float] = field(default_factory=dict)
    progress: list[str] = field(default_factory=list)
    dead_pids: set[int] = field(default_factory=set)  # killed here, or exited by themselves
    skew: dict[str, int] = field(default_factory=dict)  # what a skew would cost (skew_costs)

    steady: float = float("nan")  # jobs/s between 10 % and 90 % of the jobs finished

    @property
    def rate(self) -> float:
        """Jobs per second from the enqueue to the last job finished (the tail included)."""
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


def retrying(fn: Any, *args: Any) -> Any:
    """Run a read of the benchmark's own through a restart or a cut session (bounded)."""
    from django.db import DatabaseError, connection

    deadline = time.monotonic() + 120
    while True:
        try:
            return fn(*args)
        except DatabaseError:
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def reset() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE controlplane_jobevent, controlplane_batchreceipt, "
            "controlplane_batchmessage, controlplane_job, "
            "controlplane_operatoraction CASCADE; DELETE FROM controlplane_worker"
        )


def restart_postgres() -> None:
    from django.db import connection

    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
    )
    connection.close()


def child_pids(expected: int, killed: Any = ()) -> list[int]:
    """Supervised: the pids of the serving children, once ``expected`` of them are registered
    (a killed child's row stays until the supervisor has rescued its jobs)."""
    from jobs.models import Worker

    pids = [p for p in Worker.objects.values_list("pid", flat=True) if p and p not in killed]
    return sorted(pids) if len(pids) == expected else []


def steady_rate() -> float:
    """Jobs per second between the 10th and the 90th percentile of ``finished_at``.

    The drain's head (workers filling up) and tail (the last jobs of killed
    workers waiting for their lease) left out: the rate the chaos allows
    while there is work to do.
    """
    from tests.integration.engine.test_chaos import _rows

    low, high, count = _rows(
        "SELECT percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at), "
        "percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at), count(finished_at) "
        "FROM controlplane_job"
    )[0]
    if not count or low is None or high is None or high <= low:
        return float("nan")
    return 0.8 * count / (high - low).total_seconds()


def rescue_costs() -> dict[str, float]:
    """How long jobs of killed workers waited, from the timelines.

    For every ``job.lease_expired_requeue``: the seconds since the job's
    previous ``job.started`` (the claim of the run that the kill cut short).
    """
    from tests.integration.engine.test_chaos import _rows

    waits = [
        row[0]
        for row in _rows(
            "SELECT extract(epoch FROM r.ts - (SELECT max(s.ts) FROM controlplane_jobevent s "
            "WHERE s.job_id = r.job_id AND s.event = 'job.started' AND s.seq < r.seq)) "
            "FROM controlplane_jobevent r WHERE r.event = 'job.lease_expired_requeue'"
        )
        if row[0] is not None
    ]
    outage = _rows("SELECT count(*) FROM controlplane_jobevent WHERE event = 'job.outage_requeue'")[
        0
    ][0]
    return {
        "lease_requeues": len(waits),
        "wait_mean": statistics.fmean(waits) if waits else 0.0,
        "wait_max": max(waits, default=0.0),
        "stranded_job_seconds": sum(float(w) for w in waits),
        "outage_requeues": outage,
    }


def worker_pids(logs: list[str]) -> dict[str, int]:
    """Worker id -> pid, from the ``worker.started`` lines of the processes' logs."""
    found = re.findall(r"worker\.started id=([0-9a-f-]+) .*? pid=(\d+)", "\n".join(logs))
    return {worker: int(pid) for worker, pid in found}


def skew_costs(dead_pids: set[int], pids: dict[str, int]) -> dict[str, int]:
    """What skewed clocks cost, as ``bench/clock_skew.py`` counts it.

    - revoked live: lease rescues of jobs whose worker was alive: the pid of
      the ``job.started`` before each rescue (its ``pid`` field, else its
      ``worker`` id through ``pids``) is not one this benchmark killed (nor
      one that exited by itself);
    - revoked dead: the other rescues (the kills' own, expected);
    - failed: jobs that ended ``failed``;
    - unordered: timelines whose seq order is not their time order, from
      ``created_at`` on.
    """
    from tests.integration.engine.test_chaos import _rows

    rescued_pids = [
        int(pid) if pid else pids.get(worker)
        for pid, worker in _rows(
            "SELECT s.fields->>'pid', s.fields->>'worker' FROM controlplane_jobevent r "
            "LEFT JOIN LATERAL (SELECT fields FROM controlplane_jobevent s "
            "WHERE s.job_id = r.job_id AND s.event = 'job.started' AND s.seq < r.seq "
            "ORDER BY s.seq DESC LIMIT 1) s ON true "
            "WHERE r.event IN ('job.lease_expired_requeue', 'job.lease_expired')"
        )
    ]
    unknown = sum(1 for pid in rescued_pids if pid is None)
    live = sum(1 for pid in rescued_pids if pid is not None and pid not in dead_pids)
    failed = _rows("SELECT count(*) FROM controlplane_job WHERE status = 'failed'")[0][0]
    unordered = _rows(
        "SELECT count(DISTINCT job_id) FROM ("
        "  SELECT e.job_id, e.ts, lag(e.ts) OVER (PARTITION BY e.job_id ORDER BY e.seq) AS prev,"
        "         j.created_at FROM controlplane_jobevent e"
        "  JOIN controlplane_job j ON j.id = e.job_id"
        ") t WHERE t.ts < coalesce(t.prev, t.created_at)"
    )[0][0]
    jobs = _rows("SELECT count(*) FROM controlplane_job")[0][0]
    return {
        "revoked_live": live,
        "revoked_dead": len(rescued_pids) - live - unknown,
        "revoked_unknown": unknown,
        "failed": failed,
        "unordered": unordered,
        "timelines": jobs,
    }


def run_phase(name: str, args: argparse.Namespace, env: dict[str, str], chaos: bool) -> Phase:
    """Start the reaper and the workers, enqueue the jobs in one commit, wait until all are done."""
    from django.db import connection, transaction

    from jobs.enqueue import enqueue_many
    from tests.integration.engine.test_chaos import (
        chaos_specs,
        serving,
        terminal_count,
        terminate_other_sessions,
        violations,
    )

    phase = Phase(name, args.jobs)
    retrying(reset)
    counter = iter(range(1_000_000))

    def clock(sign: int) -> dict[str, str]:
        """The environment of a process S slow (sign -1) or S fast (+1); as is without --skew."""
        return skewed(env, sign * args.skew) if args.skew else env

    def start_worker() -> Proc:
        argv = ["runworker", "--queue", QUEUE, "--concurrency", str(args.concurrency)]
        index = next(counter)
        return Proc(argv, clock(-1 if index % 2 == 0 else 1), f"{name}-worker-{index}")

    reaper = Proc(["reaper"], clock(1), f"{name}-reaper")
    if args.supervised:
        supervisor = Proc(
            [
                "runworker",
                "--queue",
                QUEUE,
                "--concurrency",
                str(args.concurrency),
                "--processes",
                str(args.workers),
            ],
            clock(-1),
            f"{name}-supervisor",
        )
        workers = []
        everyone: list[Proc] = [reaper, supervisor]
    else:
        workers = [start_worker() for _ in range(args.workers)]
        everyone = [reaper, *workers]
    rng = random.Random(args.seed)
    killed_at: dict[int, float] = {}  # supervised: a killed child's pid -> when
    try:
        deadline = time.monotonic() + 120
        while not (
            retrying(child_pids, args.workers)
            if args.supervised
            else all(serving(w) for w in workers)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: workers not serving after 120 s (logs in {LOG_DIR})")
            time.sleep(0.1)
        with transaction.atomic():
            enqueue_many(chaos_specs(args.jobs, random.Random(args.seed), queue=QUEUE))
        began = time.monotonic()
        next_kill = began + args.kill_every
        next_mark = began
        database = connection.settings_dict["NAME"]
        while (elapsed := time.monotonic() - began) < args.max_seconds:
            done = retrying(terminal_count)
            if time.monotonic() >= next_mark:
                phase.progress.append(f"{elapsed:.0f}s:{done}")
                print(f"  [{name}] {elapsed:6.1f} s: {done:,} of {args.jobs:,} done", flush=True)
                next_mark += 10.0
            if done >= args.jobs:
                break
            for w in workers:
                if w.serving_after is None and serving(w):
                    w.serving_after = time.monotonic() - w.spawned
                    phase.serving_after.append(w.serving_after)
            for index, w in enumerate(workers):
                if w.popen.poll() is not None:  # exited by itself: replace it, note it
                    print(f"  [{name}] worker pid {w.pid} exited {w.popen.returncode}")
                    phase.dead_pids.add(w.pid)
                    workers[index] = start_worker()
                    everyone.append(workers[index])
            if args.supervised:
                pids = retrying(child_pids, args.workers, set(killed_at))
                if pids and killed_at:  # a full set again: the replacement serves
                    phase.serving_after.append(time.monotonic() - max(killed_at.values()))
                    killed_at.clear()
            if not chaos:
                time.sleep(0.1)
                continue
            all_serving = bool(pids) if args.supervised else all(serving(w) for w in workers)
            if phase.sessions_terminated is None and done >= args.jobs * TERMINATE_AT:
                phase.sessions_terminated = retrying(terminate_other_sessions, database)
                print(f"  [{name}] cut {phase.sessions_terminated} sessions", flush=True)
            if args.restart_postgres and not phase.restarted and done >= args.jobs * RESTART_AT:
                print(f"  [{name}] restarting PostgreSQL", flush=True)
                restart_postgres()
                phase.restarted = True
            if time.monotonic() >= next_kill:
                if all_serving and args.supervised:
                    victim = rng.choice(pids)
                    os.kill(victim, signal.SIGKILL)  # the supervisor forks a replacement
                    phase.dead_pids.add(victim)
                    killed_at[victim] = time.monotonic()
                    phase.kills += 1
                    next_kill = time.monotonic() + args.kill_every
                elif all_serving:
                    index = rng.randrange(len(workers))
                    workers[index].kill()
                    phase.dead_pids.add(workers[index].pid)
                    phase.kills += 1
                    workers[index] = start_worker()
                    everyone.append(workers[index])
                    next_kill = time.monotonic() + args.kill_every
                else:
                    phase.postponed += 1
            time.sleep(0.1)
        phase.seconds = time.monotonic() - began
    finally:
        for proc in everyone:
            proc.stop()
    phase.problems = retrying(violations)
    phase.steady = retrying(steady_rate)
    phase.rescues = retrying(rescue_costs)
    pids = worker_pids([proc.output() for proc in everyone])
    phase.skew = retrying(skew_costs, phase.dead_pids, pids)  # without --skew too: the baseline
    return phase


def summary(phase: Phase) -> list[str]:
    counts = {k: len(v) for k, v in phase.problems.items()}
    lines = [
        f"{phase.name}: {phase.jobs:,} jobs in {phase.seconds:.1f} s = {phase.rate:,.1f} jobs/s "
        f"(steady, 10-90 %: {phase.steady:,.1f} jobs/s); terminal by time "
        + " ".join(phase.progress),
        "  stuck (not terminal) {}, lost (not succeeded) {}, succeeded twice {}, seq gaps {}, "
        "atomic side effects not exactly once {}".format(
            counts.get("not terminal", 0),
            counts.get("not succeeded", 0),
            counts.get("succeeded twice", 0),
            counts.get("seq gap", 0),
            counts.get("atomic side effect not exactly once", 0),
        ),
    ]
    for key, items in phase.problems.items():
        lines.append(f"  {key}: {len(items)}, e.g. {items[0].splitlines()[0][:300]}")
    if phase.skew:
        k = phase.skew
        lines.append(
            f"  revoked live {k['revoked_live']} (rescues of jobs of killed or "
            f"exited workers: {k['revoked_dead']}"
            + (f", of unknown workers: {k['revoked_unknown']}" if k["revoked_unknown"] else "")
            + f"), failed {k['failed']}, unordered timelines {k['unordered']}/{k['timelines']}"
        )
    r = phase.rescues
    if phase.kills or r.get("lease_requeues"):
        serving = phase.serving_after
        lines.append(
            f"  {phase.kills} kills (postponed {phase.postponed} x 0.1 s while a replacement "
            f"started), {phase.sessions_terminated} sessions cut"
            + (", PostgreSQL restarted" if phase.restarted else "")
        )
        lines.append(
            f"  {r['lease_requeues']:.0f} jobs requeued after a lease expiry: waited "
            f"{r['wait_mean']:.1f} s on average (max {r['wait_max']:.1f} s), "
            f"{r['stranded_job_seconds']:.0f} job-seconds in all; "
            f"{r['outage_requeues']:.0f} outage requeues"
        )
        if serving:
            lines.append(
                f"  a worker served {statistics.fmean(serving):.1f} s after its spawn "
                f"(median {statistics.median(serving):.1f} s, max {max(serving):.1f} s)"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument(
        "--supervised",
        action="store_true",
        help="one `runworker --processes WORKERS` (forked children) instead of separate workers; "
        "the kills hit its children",
    )
    parser.add_argument(
        "--restart-postgres",
        action="store_true",
        help="restart the PostgreSQL server mid-chaos (every database on it goes down)",
    )
    parser.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a CONTROLPLANE_<NAME> knob for every process, e.g. LEASE_SECONDS=10",
    )
    parser.add_argument(
        "--skew",
        type=int,
        default=0,
        metavar="SECONDS",
        help="skewed wall clocks (libfaketime): workers alternate -S / +S, the reaper +S",
    )
    parser.add_argument("--max-seconds", type=float, default=1200.0, help="bound of each phase")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--skip-calm", action="store_true")
    parser.add_argument("--database", default="bench_chaos")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = int(time.time())
    if args.skew and not Path(FAKETIME_LIB).exists():
        sys.exit(f"{FAKETIME_LIB} is missing: apt-get install faketime")

    ensure_database(args.database, fresh=True)
    url = dsn_for(args.database).replace("postgresql://", "postgres://", 1)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "CONTROLPLANE_OPERATION_MODULES": OPERATION_MODULES,
    }
    for item in args.knob:
        key, _, value = item.partition("=")
        env[f"CONTROLPLANE_{key.upper()}"] = value
    migrate = [python(), "manage.py", "migrate", "--no-input", "-v", "0"]
    subprocess.run(migrate, cwd=PROJECT, env=env, check=True)
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "CONTROLPLANE_OPERATION_MODULES")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    import tests.ops  # noqa: F401 - test.exactly_once, validated at enqueue in this process

    knobs = {k: v for k, v in env.items() if k.startswith("CONTROLPLANE_") and "MODULES" not in k}
    print(
        f"{args.jobs:,} jobs, {args.workers} workers x {args.concurrency}"
        f"{' (runworker --processes)' if args.supervised else ''}, kill every "
        f"{args.kill_every:g} s, seed {args.seed}"
        + (
            f", clocks skewed: {'supervisor -S' if args.supervised else 'workers -S / +S'}, "
            f"reaper +S, S = {args.skew} s"
            if args.skew
            else ""
        )
        + f", knobs {knobs or 'defaults'}; logs in {LOG_DIR}",
        flush=True,
    )
    calm = None if args.skip_calm else run_phase("calm", args, env, chaos=False)
    chaos = run_phase("chaos", args, env, chaos=True)
    print("\n== Results ==")
    for phase in (calm, chaos):
        if phase is not None:
            print("\n".join(summary(phase)))
    if calm is not None:
        ratio = chaos.rate / calm.rate
        steady = chaos.steady / calm.steady
        print(
            f"throughput under chaos: {ratio:.2f} of the calm baseline, whole drain "
            f"(goal >= 0.9): {'PASS' if ratio >= 0.9 else 'FAIL'}; "
            f"{steady:.2f} between 10 % and 90 % done"
        )
    # Jobs that failed (lost work) are counted above; these are the invariants proper.
    broken = {k for k in chaos.problems if k != "not succeeded"}
    print("invariants: " + ("PASS" if not broken else f"FAIL ({', '.join(sorted(broken))})"))


if __name__ == "__main__":
    main()
