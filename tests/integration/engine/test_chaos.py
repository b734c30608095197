"""Chaos on PostgreSQL: workers killed every 2 s, every session cut once, nothing lost or doubled.

1,000 jobs (sleeps, pings and ``test.exactly_once``, an atomic operation that
writes one row in the transaction of its own success) run on three real
``runworker`` processes and one ``reaper`` with short leases. Every
``KILL_EVERY`` seconds (longer when a replacement is slow to start, see
``run_chaos``) a random worker gets ``kill -9`` and a fresh one takes its
place; once, mid-run, ``pg_terminate_backend`` cuts every other session
of the test database (the workers' and the reaper's). Then:

- every job is terminal, and succeeded (the budgets are set so chaos alone
  never exhausts them: a failure here is a defect, not bad luck);
- no job has two ``job.succeeded`` events, and every ``job.started`` is
  followed by exactly one outcome (success, requeue, failure) before the next;
- every job's events are numbered 1..n with no gap, ending at the job's
  ``last_event_seq``;
- each atomic job's row exists exactly once.

The whole test is bounded (chaos stops after ``CHAOS_SECONDS``, the rest
must settle within ``SETTLE_SECONDS``); on failure it prints the jobs that
are stuck and the tail of every worker's and the reaper's log.

``bench/chaos.py`` runs the same chaos longer, against a calm baseline, with
an optional real PostgreSQL restart, and imports its jobs and checks from here.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(175)]

JOBS = 1000
WORKERS = 3
CONCURRENCY = 4
KILL_EVERY = 2.0
CHAOS_SECONDS = 75.0  # kills stop after this, done or not
SETTLE_SECONDS = 35.0  # then the survivors and the reaper must finish the rest
MIN_KILLS = 3  # about 10 on a quiet machine; 6 when others load its 2 cores 7 times over
TERMINATE_AT = 0.4  # the share of terminal jobs at which every session is cut once
ATOMIC = "test.exactly_once"
SIDE_EFFECT = "chaos.side_effect"

# On top of the test knobs (lease 3 s, heartbeat 0.3 s, reaper every 0.3 s):
# budgets chaos cannot exhaust, so every job must end up succeeded.
CHAOS_KNOBS = {
    "CONTROLPLANE_MAX_LEASE_REQUEUES": "50",
    "CONTROLPLANE_MAX_OUTAGE_REQUEUES": "10",
}

# What ends one run of a job (each ``job.started`` is followed by exactly one).
RUN_ENDS = frozenset(
    {
        "job.succeeded",
        "job.failed",
        "job.retry_scheduled",
        "job.retry_later",
        "job.outage_requeue",
        "job.requeued",
        "job.lease_expired_requeue",
        "job.lease_expired",
        "job.timeout",
        "job.cancelled",
    }
)
TERMINAL = ("succeeded", "failed", "cancelled")


# --- the jobs and the checks (shared with bench/chaos.py) -----------------------------


def chaos_specs(count: int, rng: random.Random, *, queue: str = "default") -> list[Any]:
    """``count`` jobs: 60 % short sleeps (one tick each), 20 % pings, 20 % atomic writes.

    The sleeps last long enough (50–350 ms) that a kill always finds work
    in flight; the atomic jobs sleep inside their transaction for the same reason.
    """
    from jobs.enqueue import JobSpec

    specs = []
    for _ in range(count):
        draw = rng.random()
        seconds = round(rng.uniform(0.05, 0.35), 3)
        if draw < 0.6:
            specs.append(JobSpec("sleep", {"seconds": seconds, "emit_every": seconds}, queue=queue))
        elif draw < 0.8:
            specs.append(JobSpec("ping", {}, queue=queue))
        else:
            specs.append(JobSpec(ATOMIC, {"seconds": seconds}, queue=queue))
    return specs


def _rows(sql: str, params: Iterable[Any] = ()) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def terminal_count() -> int:
    return _rows(f"SELECT count(*) FROM controlplane_job WHERE status IN {TERMINAL}")[0][0]


def violations(*, expect_all_succeeded: bool = True) -> dict[str, list[str]]:
    """Every broken invariant, by name, with the jobs it concerns (empty lists: all held)."""
    found: dict[str, list[str]] = defaultdict(list)
    jobs = {
        str(job_id): (operation, status, f"{error_code}: {error_message[:300]}", last_seq)
        for job_id, operation, status, error_code, error_message, last_seq in _rows(
            "SELECT id, operation, status, error_code, error_message, last_event_seq "
            "FROM controlplane_job"
        )
    }
    for job_id, (operation, status, error, _) in jobs.items():
        if status not in TERMINAL:
            found["not terminal"].append(f"{job_id} {operation} {status}")
        elif expect_all_succeeded and status != "succeeded":
            found["not succeeded"].append(f"{job_id} {operation} {status} {error}")
    timelines: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for job_id, seq, event in _rows(
        "SELECT job_id, seq, event FROM controlplane_jobevent ORDER BY 1, 2"
    ):
        timelines[str(job_id)].append((seq, event))
    for job_id, (_, status, _, last_seq) in jobs.items():
        timeline = timelines.get(job_id, [])
        if not timeline or timeline[0][0] != 1:
            timeline.insert(0, (1, "job.enqueued"))  # implied by the job row (jobs.timeline)
        seqs = [seq for seq, _ in timeline]
        if seqs != list(range(1, len(seqs) + 1)) or (seqs and seqs[-1] != last_seq):
            found["seq gap"].append(f"{job_id} seqs={seqs} last_event_seq={last_seq}")
        names = [event for _, event in timeline]
        if names.count("job.succeeded") > 1:
            found["succeeded twice"].append(f"{job_id} {names}")
        if status == "succeeded" and names.count("job.succeeded") != 1:
            found["succeeded without one job.succeeded"].append(f"{job_id} {names}")
        open_run = False
        for name in names:
            if name == "job.started":
                if open_run:
                    found["started twice without an outcome"].append(f"{job_id} {names}")
                    break
                open_run = True
            elif name in RUN_ENDS and name != "job.cancelled":
                if not open_run:
                    found["outcome without a run"].append(f"{job_id} {names}")
                    break
                open_run = False
    effects = dict(
        _rows(
            "SELECT target, count(*) FROM controlplane_operatoraction "
            "WHERE action = %s GROUP BY target",
            [SIDE_EFFECT],
        )
    )
    for job_id, (operation, status, _, _) in jobs.items():
        if operation != ATOMIC:
            continue
        expected = 1 if status == "succeeded" else 0
        if effects.get(job_id, 0) != expected:
            found["atomic side effect not exactly once"].append(
                f"{job_id} {status}: {effects.get(job_id, 0)} rows"
            )
    for target in set(effects) - set(jobs):
        found["atomic side effect of an unknown job"].append(target)
    return dict(found)


def stuck_report(limit: int = 15) -> str:
    """The jobs that are not terminal, each with its lease and the end of its timeline."""
    rows = _rows(
        f"SELECT id, operation, status, worker_id, leased_until, attempts, lease_requeues "
        f"FROM controlplane_job WHERE status NOT IN {TERMINAL} ORDER BY created_at LIMIT %s",
        [limit],
    )
    total = _rows(f"SELECT count(*) FROM controlplane_job WHERE status NOT IN {TERMINAL}")[0][0]
    lines = [f"{total} job(s) not terminal; the first {len(rows)}:"]
    for job_id, operation, status, worker, leased_until, attempts, requeues in rows:
        events = _rows(
            "SELECT seq, event, ts FROM controlplane_jobevent "
            "WHERE job_id = %s ORDER BY seq DESC LIMIT 6",
            [job_id],
        )
        lines.append(
            f"  {job_id} {operation} {status} worker={worker} leased_until={leased_until} "
            f"attempts={attempts} lease_requeues={requeues}; last events: "
            + ", ".join(f"{seq}:{event}@{ts:%H:%M:%S.%f}" for seq, event, ts in reversed(events))
        )
    workers = _rows("SELECT id, pid, last_heartbeat FROM controlplane_worker ORDER BY started_at")
    lines.append("worker rows: " + "; ".join(f"{w} pid={p} beat={b}" for w, p, b in workers))
    return "\n".join(lines)


def terminate_other_sessions(database: str) -> int:
    """``pg_terminate_backend`` every client session of ``database`` but this one."""
    return _rows(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
        [database],
    )[0][0]


# --- the chaos driver -------------------------------------------------------------------


@dataclass
class ChaosLog:
    """What the chaos did, for the assertions and the failure report."""

    kills: int = 0
    postponed: int = 0  # kill checks (every 0.1 s) that found a worker still starting
    sessions_terminated: int | None = None
    exited_on_their_own: list[str] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)  # "seconds:terminal jobs", every 5 s
    all_processes: list[Any] = field(default_factory=list)


def logs_report(processes: list[Any], tail: int = 1500) -> str:
    """The end of every process's log, newest processes last."""
    parts = []
    for proc in processes:
        code = proc.popen.poll()
        parts.append(
            f"--- {' '.join(proc.args)} pid={proc.pid} exit={code} ({proc.log_path}) ---\n"
            + proc.output()[-tail:]
        )
    return "\n".join(parts)


def serving(proc: Any) -> bool:
    """Whether a worker process got as far as serving its queues."""
    return proc.popen.poll() is None and "worker.started" in proc.output()


def run_chaos(
    start_worker: Callable[[], Any],
    *,
    workers: list[Any],
    rng: random.Random,
    chaos: ChaosLog,
    database: str,
    jobs: int,
    seconds: float,
) -> None:
    """Kill a random worker every ``KILL_EVERY`` s and cut every session once, until done.

    A kill waits until every worker is serving (``worker.started`` in its
    log): a replacement starts in about 1.5 s here, within the cadence, but
    on a loaded machine it can take longer than ``KILL_EVERY``, and killing
    workers before they claim anything would starve the run instead of
    testing recovery (then the cadence stretches; ``postponed`` says by how
    much). The sessions are cut once ``TERMINATE_AT`` of the jobs are done
    (or halfway through ``seconds``), again with every worker serving, so
    each one loses its connections. Stops when every job is terminal or
    after ``seconds``. A worker that exited without being killed is
    recorded (a defect) and replaced too.
    """
    started = time.monotonic()
    next_kill = started + KILL_EVERY
    next_mark = started
    while (elapsed := time.monotonic() - started) < seconds:
        done = terminal_count()
        if time.monotonic() >= next_mark:
            chaos.progress.append(f"{elapsed:.0f}s:{done}")
            next_mark += 5.0
        if done >= jobs:
            return
        for index, proc in enumerate(workers):
            if proc.popen.poll() is not None:
                chaos.exited_on_their_own.append(f"pid {proc.pid} exit {proc.popen.returncode}")
                workers[index] = start_worker()
                chaos.all_processes.append(workers[index])
        all_serving = all(serving(proc) for proc in workers)
        if (
            chaos.sessions_terminated is None
            and (done >= jobs * TERMINATE_AT or elapsed >= seconds / 2)
            and all_serving
        ):
            chaos.sessions_terminated = terminate_other_sessions(database)
        if time.monotonic() >= next_kill:
            if all_serving:
                index = rng.randrange(len(workers))
                victim = workers[index]
                victim.popen.send_signal(signal.SIGKILL)
                victim.popen.wait(timeout=10)
                chaos.kills += 1
                workers[index] = start_worker()
                chaos.all_processes.append(workers[index])
                next_kill = time.monotonic() + KILL_EVERY
            else:
                chaos.postponed += 1
        time.sleep(0.1)


# --- the test -----------------------------------------------------------------------------


def test_chaos_loses_nothing_and_doubles_nothing(worker, start_process):
    if connection.vendor != "postgresql":
        pytest.skip(
            "PostgreSQL only: the chaos cuts sessions with pg_terminate_backend, and SQLite's "
            "single writer would measure lock waits, not recovery"
        )
    from jobs.enqueue import enqueue_many

    seed = int(os.environ.get("CONTROLPLANE_CHAOS_SEED") or time.time())
    rng = random.Random(seed)
    enqueue_many(chaos_specs(JOBS, rng))
    database = connection.settings_dict["NAME"]

    def start_worker() -> Any:
        return worker(args=("--concurrency", str(CONCURRENCY)), env=CHAOS_KNOBS)

    reaper = start_process("reaper", "--interval", "0.3", env=CHAOS_KNOBS)
    workers = [start_worker() for _ in range(WORKERS)]
    chaos = ChaosLog(all_processes=[reaper, *workers])
    began = time.monotonic()

    def report(reason: str) -> str:
        return (
            f"{reason}\nseed={seed} kills={chaos.kills} postponed={chaos.postponed} "
            f"sessions_terminated={chaos.sessions_terminated} "
            f"elapsed={time.monotonic() - began:.1f}s progress={' '.join(chaos.progress)}\n"
            f"{stuck_report()}\n"
            f"{logs_report(chaos.all_processes)}"
        )

    try:
        run_chaos(
            start_worker,
            workers=workers,
            rng=rng,
            chaos=chaos,
            database=database,
            jobs=JOBS,
            seconds=CHAOS_SECONDS,
        )
        chaos_done = time.monotonic()
        deadline = chaos_done + SETTLE_SECONDS
        while terminal_count() < JOBS and time.monotonic() < deadline:
            time.sleep(0.2)
        problems = violations()
        chaos.exited_on_their_own += [
            f"pid {proc.pid} exit {proc.popen.returncode}"
            for proc in [reaper, *workers]
            if proc.popen.poll() is not None
        ]
    except Exception as error:
        pytest.fail(report(f"The chaos run broke: {error!r}"))
    print(
        f"chaos: seed={seed} {JOBS} jobs, {chaos.kills} kills "
        f"(postponed {chaos.postponed} x 0.1 s), "
        f"{chaos.sessions_terminated} sessions terminated, "
        f"chaos {chaos_done - began:.1f}s, checked at {time.monotonic() - began:.1f}s; "
        f"terminal jobs by time: {' '.join(chaos.progress)}"
    )
    if problems:
        summary = "\n".join(
            f"{name}: {len(items)}, e.g.\n    " + "\n    ".join(items[:5])
            for name, items in problems.items()
        )
        pytest.fail(report(f"Invariants broken:\n{summary}"))
    if chaos.sessions_terminated is None or chaos.sessions_terminated < WORKERS + 1:
        pytest.fail(report(f"Not every worker's session was cut: {chaos.sessions_terminated}."))
    if chaos.kills < MIN_KILLS:
        pytest.fail(report(f"Only {chaos.kills} kills: the chaos ended before it began."))
    if chaos.exited_on_their_own:
        pytest.fail(report(f"Processes exited without being killed: {chaos.exited_on_their_own}."))
