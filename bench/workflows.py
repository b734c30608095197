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
        workflow_id, enqueue_seconds = side.enqueue_graph("fan-in", steps)
        if kill:  # one worker killed with SIGKILL halfway through the dependencies
            side.wait(lambda: ((n := side.succeeded()) >= steps // 2, n), group)
            group.procs[0].send_signal(signal.SIGKILL)
            group.procs[0].wait()
            group.procs = group.procs[1:]
            group.logs = group.logs[1:]
        side.wait(lambda: side.workflow_done(workflow_id), group)
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
        side.enqueue([[QUEUE, jobs, None, 1]])
        side.wait(lambda: ((n := side.succeeded()) >= jobs, n), group)
    finally:
        group.stop()
    first, last = side.sql(
        "SELECT min(ts) FILTER (WHERE event = 'job.started'), "
        "max(ts) FILTER (WHERE event = 'job.succeeded') FROM controlplane_jobevent"
    )[0]
    return {"rate": jobs / (last - first).total_seconds()}


# --- target 2: chain -----------------------------------------------------------------


def chain(side: GraphSide, steps: int, *, processes: int, concurrency: int) -> dict[str, float]:
    """``steps`` pings in a line: steps/s end to end and the step-to-step latency."""
    side.reset()
    group = side.workers(QUEUE, concurrency, processes)
    try:
        workflow_id, _ = side.enqueue_graph("chain", steps)
        side.wait(lambda: side.workflow_done(workflow_id), group)
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
    skip = set(filter(None, args.skip.split(",")))
    for side in filter(None, [before, after]):
        side.setup()

    k, p4 = args.concurrency, args.fan_in_processes
    variants = []
    if before and "plain" not in skip:
        variants.append(("before, plain", lambda: drain(before, args.jobs, keys=0, concurrency=k)))
        variants.append(("after, plain", lambda: drain(after, args.jobs, keys=0, concurrency=k)))
    if "fan-in" not in skip:
        variants.append(("fan-in", lambda: fan_in(after, args.fan_in, processes=p4, concurrency=k)))
        variants.append(
            (
                f"plain x{p4}",
                lambda: plain(after, args.fan_in, processes=p4, concurrency=k),
            )
        )
    if "chain" not in skip:
        variants.append(("chain", lambda: chain(after, args.chain, processes=2, concurrency=k)))
    results: dict[str, list[dict]] = {name: [] for name, _ in variants}
    for round_no in range(args.rounds):
        order = variants if round_no % 4 in (0, 3) else variants[::-1]  # ABBA
        for name, run in order:
            figures = run()
            results[name].append(figures)
            shown = ", ".join(f"{key} {value:,.2f}" for key, value in figures.items())
            print(f"round {round_no + 1} {name}: {shown}", flush=True)
    killed = (
        fan_in(after, args.fan_in, processes=p4, concurrency=k, kill=True) if args.kill else None
    )

    def med(name: str, key: str) -> float:
        return median([r[key] for r in results[name]])

    def each(name: str, key: str, fmt: str = ",.0f") -> str:
        return ", ".join(f"{r[key]:{fmt}}" for r in results[name])

    print()
    if "fan-in" in results:
        gap = med("fan-in", "final_gap_ms")
        print(
            f"target 1, fan-in {args.fan_in:,} -> 1, {p4} processes x {k}: final step started "
            f"{gap:,.0f} ms after the last dependency's success (median; runs "
            f"{each('fan-in', 'final_gap_ms')}), exactly once in every run; "
            f"{'PASS' if gap < 1000 else 'MISS'} (target: < 1 s)"
        )
        print(
            f"  dependencies drained at {med('fan-in', 'rate'):,.0f} steps/s (runs "
            f"{each('fan-in', 'rate')}); plain pings on the same workers "
            f"{med(f'plain x{p4}', 'rate'):,.0f} jobs/s (runs {each(f'plain x{p4}', 'rate')}); "
            f"enqueue of the workflow {med('fan-in', 'enqueue_s'):.1f} s"
        )
    if killed:
        print(
            f"  with a kill -9 halfway and a reaper: final step once, every step succeeded "
            f"once, {killed['rescued']:.0f} rescued; final {killed['final_gap_ms']:,.0f} ms "
            f"after the last dependency; {killed['rate']:,.0f} steps/s"
        )
    if "chain" in results:
        rate = med("chain", "steps_per_s")
        print(
            f"target 2, chain of {args.chain:,}, 2 processes x {k}: {rate:,.0f} steps/s (runs "
            f"{each('chain', 'steps_per_s')}); {'PASS' if rate >= 100 else 'MISS'} "
            f"(target: >= 100); step to step p50 {med('chain', 'p50_ms'):.1f} ms, p95 "
            f"{med('chain', 'p95_ms'):.1f} ms, max {med('chain', 'max_ms'):.1f} ms (medians; "
            f"p50 runs {each('chain', 'p50_ms', '.1f')}, p95 runs {each('chain', 'p95_ms', '.1f')})"
            f"; next step on the other worker {med('chain', 'other_worker'):.0%}"
        )
    if "before, plain" in results:
        ratio = med("after, plain", "rate") / med("before, plain", "rate")
        per_round = [
            a["rate"] / b["rate"]
            for a, b in zip(results["after, plain"], results["before, plain"], strict=True)
        ]
        cpu = med("after, plain", "cpu_ms") / med("before, plain", "cpu_ms")
        print(
            f"target 3, {args.jobs:,} plain pings, 2 processes x {k}: after "
            f"{med('after, plain', 'rate'):,.0f} jobs/s (runs {each('after, plain', 'rate')}), "
            f"before {med('before, plain', 'rate'):,.0f} (runs {each('before, plain', 'rate')}); "
            f"after / before = {ratio:.3f} on the medians, per round "
            f"{', '.join(f'{r:.2f}' for r in per_round)} (median {median(per_round):.3f}); "
            f"CPU per job {med('after, plain', 'cpu_ms'):.3f} / "
            f"{med('before, plain', 'cpu_ms'):.3f} ms = {cpu:.3f}; "
            f"{'PASS' if ratio >= 0.97 else 'MISS'} (target: within 3%)"
        )


if __name__ == "__main__":
    main()
