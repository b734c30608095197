"""Workflows (issue 31) on PostgreSQL: its three speed targets, in one run.

    .venv/bin/python bench/workflows.py --before PATH [--after PATH] [--rounds 4] [--kill]

1. **Fan-in**: a workflow of 10,000 no-op ``ping`` steps into one final
   ``ping`` (``jobs.workflows.workflow``), committed in one transaction while
   4 ``runworker --concurrency 32`` processes wait: the dependencies' drain
   rate, and the final step's ``job.started`` minus the last dependency's
   ``job.succeeded`` (target < 1 s; its ``job.started`` events: exactly 1).
   Beside it in every round, 10,000 plain pings on the same 4 workers.
   ``--kill`` adds one fan-in run with short leases and a reaper in which one
   worker is killed with SIGKILL halfway: still every step succeeded once and
   the final step started once.
2. **Chain**: 1,000 ``ping`` steps each waiting for the one before, 2
   workers: steps/s from the first step's start to the last one's success
   (target >= 100), and the step-to-step latency (a step's ``started_at``
   minus the previous step's ``finished_at``) p50/p95.
3. **No tax on plain jobs**: 20,000 ``ping`` jobs drained by 2 ``runworker
   --concurrency 32`` at the checkout before workflows (``--before``, a
   ``git worktree`` of 8e044ae) and at this one (``--after``), each in its own
   database: the drain of ``bench/flow_keys.py`` (its ``Side`` and ``drain``).

Workers are started, registered and idle before the jobs appear in one
commit; the jobs are enqueued by a child process of the checkout under test.
Rounds alternate their order (ABBA); figures are medians over the rounds,
every round printed. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from flow_keys import (  # noqa: E402
    ALWAYS_TRUNCATED,
    FLOW_TABLES,
    KEYED_QUEUE,
    PLAIN_QUEUE,
    SITECUSTOMIZE,
    Side,
    drain,
)
from peers import LOG_DIR, WorkerGroup, median, percentile, python  # noqa: E402

QUEUE = "bench_wf"
GRAPH_TABLES = ("controlplane_dependency", "controlplane_workflow")
# Short leases for the run with a kill -9, so the reaper rescues the dead worker's jobs soon.
KILL_KNOBS = {
    "CONTROLPLANE_LEASE_SECONDS": "3",
    "CONTROLPLANE_HEARTBEAT_SECONDS": "0.3",
    "CONTROLPLANE_WORKER_TIMEOUT_SECONDS": "3",
    "CONTROLPLANE_REAPER_INTERVAL_SECONDS": "0.3",
}

# Run by the checkout under test: one workflow, printed id. argv: kind, queue, steps.
ENQUEUE_GRAPH = """\
import sys
import django
django.setup()
from jobs.workflows import workflow
kind, queue, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
flow = workflow(f"bench {kind}")
if kind == "fan-in":
    deps = [flow.step("ping", {}, name=f"dep-{i:05}", queue=queue) for i in range(n)]
    flow.step("ping", {}, name="final", depends_on=deps, queue=queue)
else:
    step = None
    for i in range(n):
        step = flow.step("ping", {}, name=f"step-{i:05}", depends_on=[step] if step else [],
                         queue=queue)
print(flow.enqueue().id)
"""


@dataclass
class GraphSide(Side):
    """A checkout measured with workflows: its tables emptied too, any number of workers."""

    def reset(self) -> None:
        tables = [*ALWAYS_TRUNCATED, *FLOW_TABLES]
        if self.sql("SELECT to_regclass('controlplane_workflow')")[0][0]:  # not in "before"
            tables += GRAPH_TABLES
        self.sql(f"TRUNCATE {', '.join(tables)} CASCADE")
        self.sql("DELETE FROM controlplane_worker")
        self.sql(
            "DELETE FROM controlplane_queue WHERE name = ANY(%s)",
            [[PLAIN_QUEUE, KEYED_QUEUE, QUEUE]],
        )

    def workers(
        self,
        queue: str,
        concurrency: int,
        processes: int = 2,
        *,
        env: dict[str, str] | None = None,
        reaper: bool = False,
    ) -> WorkerGroup:
        argv = [python(), "manage.py", "runworker", "--queue", queue]
        argv += ["--concurrency", str(concurrency)]
        argvs = [argv] * processes + ([[python(), "manage.py", "reaper"]] if reaper else [])
        group = WorkerGroup(
            f"{self.name}-{queue}", argvs, env={**self.env(), **(env or {})}, cwd=self.project
        )
        deadline = time.monotonic() + 90
        while self.sql("SELECT count(*) FROM controlplane_worker")[0][0] < processes:
            group.check_alive()
            if time.monotonic() > deadline:
                group.stop()
                raise RuntimeError(f"{self.name}: workers not ready after 90 s (logs in {LOG_DIR})")
            time.sleep(0.1)
        time.sleep(1.0)  # let LISTEN connections settle
        return group

    def enqueue_graph(self, kind: str, steps: int) -> tuple[str, float]:
        """Enqueue a ``fan-in`` or ``chain`` workflow in one transaction; its id, seconds."""
        started = time.monotonic()
        out = subprocess.run(
            [python(), "-c", ENQUEUE_GRAPH, kind, QUEUE, str(steps)],
            cwd=self.project,
            env={**os.environ, **self.env()},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.strip().splitlines()[-1], time.monotonic() - started

    def workflow_done(self, workflow_id: str) -> tuple[bool, int]:
        status, done = self.sql(
            "SELECT w.status, (SELECT count(*) FROM controlplane_job j "
            "WHERE j.workflow_id = w.id AND j.status = 'succeeded') "
            "FROM controlplane_workflow w WHERE w.id = %s",
            [workflow_id],
        )[0]
        if status not in ("running", "succeeded"):
            raise RuntimeError(f"{self.name}: workflow {workflow_id} ended {status}")
        return status == "succeeded", done


def cpu_split(group: WorkerGroup, side: GraphSide, before: dict) -> tuple[float, float]:
    """CPU seconds since ``before`` of the worker processes and of their PostgreSQL backends."""
    after = group.cpu(side.backends())
    used = {"worker": 0.0, "db": 0.0}
    for key, value in after.items():
        used[key[0]] += value - before.get(key, 0.0)
    return used["worker"], used["db"]


# --- target 1: fan-in ----------------------------------------------------------------


def fan_in(
    side: GraphSide, steps: int, *, processes: int, concurrency: int, kill: bool = False
) -> dict[str, float]:
    """``steps`` pings into one: the dependencies' drain rate and the final step's delay."""
    side.reset()
    group = side.workers(
        QUEUE, concurrency, processes, env=KILL_KNOBS if kill else None, reaper=kill
    )
    try:
        cpu_before = group.cpu(side.backends())
        workflow_id, enqueue_seconds = side.enqueue_graph("fan-in", steps)
        if kill:  # one worker killed with SIGKILL halfway through the dependencies
            side.wait(lambda: ((n := side.succeeded()) >= steps // 2, n), group)
            group.procs[0].send_signal(signal.SIGKILL)
            group.procs[0].wait()
            group.procs = group.procs[1:]
            group.logs = group.logs[1:]
        side.wait(lambda: side.workflow_done(workflow_id), group)
        cpu, db = cpu_split(group, side, cpu_before)
    finally:
        group.stop()
    final_id, final_starts = side.sql(
        "SELECT j.id, (SELECT count(*) FROM controlplane_jobevent e "
        "WHERE e.job_id = j.id AND e.event = 'job.started') "
        "FROM controlplane_job j WHERE j.step = 'final'"
    )[0]
    first, last_dep, final_start, once, rescued = side.sql(
        "SELECT min(ts) FILTER (WHERE event = 'job.started'), "
        "max(ts) FILTER (WHERE event = 'job.succeeded' AND job_id <> %s), "
        "max(ts) FILTER (WHERE event = 'job.started' AND job_id = %s), "
        "count(DISTINCT job_id) FILTER (WHERE event = 'job.succeeded') "
        "= count(*) FILTER (WHERE event = 'job.succeeded'), "
        "count(*) FILTER (WHERE event = 'job.lease_expired_requeue') "
        "FROM controlplane_jobevent",
        [final_id, final_id],
    )[0]
    succeeded = side.succeeded()
    if final_starts != 1 or succeeded != steps + 1 or not once:
        raise RuntimeError(
            f"{side.name}: final started {final_starts} times, {succeeded} of {steps + 1} "
            f"succeeded, each once: {once}"
        )
    result = {
        "rate": steps / (last_dep - first).total_seconds(),
        "final_gap_ms": (final_start - last_dep).total_seconds() * 1000,
        "cpu_ms": (cpu + db) * 1000 / (steps + 1),
        "db_ms": db * 1000 / (steps + 1),
        "enqueue_s": enqueue_seconds,
    }
    if kill:
        result["rescued"] = rescued
    return result


def plain(side: GraphSide, jobs: int, *, processes: int, concurrency: int) -> dict[str, float]:
    """``jobs`` plain pings on the same workers as the fan-in: the rate without the graph."""
    side.reset()
    group = side.workers(QUEUE, concurrency, processes)
    try:
        cpu_before = group.cpu(side.backends())
        side.enqueue([[QUEUE, jobs, None, 1]])
        side.wait(lambda: ((n := side.succeeded()) >= jobs, n), group)
        cpu, db = cpu_split(group, side, cpu_before)
    finally:
        group.stop()
    first, last = side.sql(
        "SELECT min(ts) FILTER (WHERE event = 'job.started'), "
        "max(ts) FILTER (WHERE event = 'job.succeeded') FROM controlplane_jobevent"
    )[0]
    return {
        "rate": jobs / (last - first).total_seconds(),
        "cpu_ms": (cpu + db) * 1000 / jobs,
        "db_ms": db * 1000 / jobs,
    }


# --- target 2: chain -----------------------------------------------------------------


def chain(side: GraphSide, steps: int, *, processes: int, concurrency: int) -> dict[str, float]:
    """``steps`` pings in a line: steps/s end to end and the step-to-step latency."""
    side.reset()
    group = side.workers(QUEUE, concurrency, processes)
    try:
        cpu_before = group.cpu(side.backends())
        workflow_id, _ = side.enqueue_graph("chain", steps)
        side.wait(lambda: side.workflow_done(workflow_id), group)
        cpu, db = cpu_split(group, side, cpu_before)
    finally:
        group.stop()
    rows = side.sql(
        "SELECT started_at, finished_at, worker_id FROM controlplane_job "
        "WHERE workflow_id = %s ORDER BY step",
        [workflow_id],
    )
    gaps = [
        (later[0] - earlier[1]).total_seconds() * 1000
        for earlier, later in zip(rows, rows[1:], strict=False)
    ]
    if min(gaps) < 0:
        raise RuntimeError(f"{side.name}: a step started before the one it waits for ended")
    switches = sum(1 for a, b in zip(rows, rows[1:], strict=False) if a[2] != b[2])
    return {
        "steps_per_s": steps / (rows[-1][1] - rows[0][0]).total_seconds(),
        "p50_ms": percentile(gaps, 50),
        "p95_ms": percentile(gaps, 95),
        "max_ms": max(gaps),
        "other_worker": switches / (steps - 1),
        "cpu_ms": (cpu + db) * 1000 / steps,
        "db_ms": db * 1000 / steps,
    }


# --- the run -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="checkout before workflows (target 3)")
    parser.add_argument("--after", type=Path, default=BENCH_DIR.parent, help="checkout measured")
    parser.add_argument("--rounds", type=int, default=4, help="rounds (ABBA order)")
    parser.add_argument("--fan-in", type=int, default=10000, help="dependencies of the final step")
    parser.add_argument("--fan-in-processes", type=int, default=4)
    parser.add_argument("--chain", type=int, default=1000, help="steps of the chain")
    parser.add_argument("--jobs", type=int, default=20000, help="plain jobs of target 3")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--kill", action="store_true", help="a fan-in run with a kill -9 too")
    parser.add_argument("--skip", default="", help="comma list of: fan-in, chain, plain")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another checkout measured like --after in every round (A/B of a change)",
    )
    args = parser.parse_args()

    site = Path(tempfile.mkdtemp(prefix="bench-workflows-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    print(f"worker logs in {LOG_DIR}", flush=True)
    after = GraphSide("after", args.after.resolve(), "bench_wf_after", site, keyed=True)
    before = (
        GraphSide("before", args.before.resolve(), "bench_wf_before", site, keyed=True)
        if args.before
        else None
    )
    others = []
    for spec in args.also:
        name, _, path = spec.partition("=")
        others.append(GraphSide(name, Path(path).resolve(), f"bench_wf_{name}", site, keyed=True))
    skip = set(filter(None, args.skip.split(",")))
    for side in filter(None, [before, after, *others]):
        side.setup()

    k, p4 = args.concurrency, args.fan_in_processes
    variants: list[tuple[str, Callable[[], dict[str, float]]]] = []
    if "plain" not in skip:
        for side in filter(None, [before, after, *others]):
            variants.append(
                (f"{side.name}, plain", lambda s=side: drain(s, args.jobs, keys=0, concurrency=k))
            )
    for side in [after, *others]:
        if "fan-in" not in skip:
            variants.append(
                (
                    f"{side.name}, fan-in",
                    lambda s=side: fan_in(s, args.fan_in, processes=p4, concurrency=k),
                )
            )
        if "chain" not in skip:
            variants.append(
                (
                    f"{side.name}, chain",
                    lambda s=side: chain(s, args.chain, processes=2, concurrency=k),
                )
            )
    if "fan-in" not in skip:
        variants.append(
            (f"after, plain x{p4}", lambda: plain(after, args.fan_in, processes=p4, concurrency=k))
        )
    results: dict[str, list[dict]] = {name: [] for name, _ in variants}
    for round_no in range(args.rounds):
        order = variants if round_no % 4 in (0, 3) else variants[::-1]  # ABBA
        for name, run in order:
            figures = run()
            results[name].append(figures)
            shown = ", ".join(f"{key} {value:,.2f}" for key, value in figures.items())
            print(f"round {round_no + 1} {name}: {shown}", flush=True)
    killed = {
        side.name: fan_in(side, args.fan_in, processes=p4, concurrency=k, kill=True)
        for side in ([after, *others] if args.kill else [])
    }

    def med(name: str, key: str) -> float:
        return median([r[key] for r in results[name]])

    def each(name: str, key: str, fmt: str = ",.0f") -> str:
        return ", ".join(f"{r[key]:{fmt}}" for r in results[name])

    print()
    for side in [after, *others]:
        fan, line = f"{side.name}, fan-in", f"{side.name}, chain"
        if fan in results:
            gap = med(fan, "final_gap_ms")
            print(
                f"target 1 ({side.name}), fan-in {args.fan_in:,} -> 1, {p4} processes x {k}: "
                f"final step started {gap:,.0f} ms after the last dependency's success (median;"
                f" runs {each(fan, 'final_gap_ms')}), exactly once in every run; "
                f"{'PASS' if gap < 1000 else 'MISS'} (target: < 1 s)"
            )
            print(
                f"  dependencies drained at {med(fan, 'rate'):,.0f} steps/s (runs "
                f"{each(fan, 'rate')}), CPU {med(fan, 'cpu_ms'):.3f} ms per step (database "
                f"{med(fan, 'db_ms'):.3f}); "
                f"enqueue of the workflow {med(fan, 'enqueue_s'):.1f} s"
            )
        if side.name in killed:
            hit = killed[side.name]
            print(
                f"  with a kill -9 halfway and a reaper: final step once, every step succeeded "
                f"once, {hit['rescued']:.0f} rescued; final {hit['final_gap_ms']:,.0f} ms "
                f"after the last dependency; {hit['rate']:,.0f} steps/s"
            )
        if line in results:
            rate = med(line, "steps_per_s")
            print(
                f"target 2 ({side.name}), chain of {args.chain:,}, 2 processes x {k}: "
                f"{rate:,.0f} steps/s (runs {each(line, 'steps_per_s')}); "
                f"{'PASS' if rate >= 100 else 'MISS'} (target: >= 100); step to step p50 "
                f"{med(line, 'p50_ms'):.1f} ms, p95 {med(line, 'p95_ms'):.1f} ms, max "
                f"{med(line, 'max_ms'):.1f} ms (medians; p50 runs {each(line, 'p50_ms', '.1f')},"
                f" p95 runs {each(line, 'p95_ms', '.1f')}); CPU {med(line, 'cpu_ms'):.2f} ms "
                f"per step (database {med(line, 'db_ms'):.2f}); next step on the other worker "
                f"{med(line, 'other_worker'):.0%}"
            )
    x4 = f"after, plain x{p4}"
    if x4 in results:
        print(
            f"plain pings on the fan-in's workers ({args.fan_in:,}, {p4} x {k}): "
            f"{med(x4, 'rate'):,.0f} jobs/s (runs {each(x4, 'rate')}), CPU "
            f"{med(x4, 'cpu_ms'):.3f} ms per job (database {med(x4, 'db_ms'):.3f})"
        )
    for side in [after, *others] if before else []:
        a, b = f"{side.name}, plain", "before, plain"
        if a not in results:
            continue
        ratio = med(a, "rate") / med(b, "rate")
        per_round = [x["rate"] / y["rate"] for x, y in zip(results[a], results[b], strict=True)]
        print(
            f"target 3 ({side.name}), {args.jobs:,} plain pings, 2 processes x {k}: "
            f"{med(a, 'rate'):,.0f} jobs/s (runs {each(a, 'rate')}), before "
            f"{med(b, 'rate'):,.0f} (runs {each(b, 'rate')}); ratio {ratio:.3f} on the medians, "
            f"per round {', '.join(f'{r:.2f}' for r in per_round)} (median "
            f"{median(per_round):.3f}); CPU per job {med(a, 'cpu_ms'):.3f} / "
            f"{med(b, 'cpu_ms'):.3f} ms = {med(a, 'cpu_ms') / med(b, 'cpu_ms'):.3f}; "
            f"{'PASS' if ratio >= 0.97 else 'MISS'} (target: within 3%)"
        )


if __name__ == "__main__":
    main()
