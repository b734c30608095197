"""Flow control by key (issue 30) on PostgreSQL: its three speed targets, in one run.

    .venv/bin/python bench/flow_keys.py [--before PATH] [--after PATH] [--rounds 4]

1. **No tax when unused**: 20,000 unkeyed ``ping`` jobs drained by the
   checkout before flow keys (``--before``, e.g. a ``git worktree`` of
   bd11d85) and by this one (``--after``), each in its own fresh database.
2. **Keys at full speed**: 20,000 ``ping`` jobs over 1,000 keys ``k:0`` ..
   ``k:999`` whose family ``k`` has a concurrency limit of 1
   (``jobs.operator_actions.set_key_limits``), against the unkeyed drain of
   the same checkout in the same round.
3. **Fairness**: 50,000 jobs of key ``A`` committed, then 100 of key ``B``:
   how many of A's jobs finished before B's last, and B's p95 wait
   (``started_at - created_at``) against 100 B jobs on an empty queue.

Every drain is two separate ``manage.py runworker --queue Q --concurrency 32``
processes, started, registered and idle before the jobs appear in one commit
(``bench.peers.WorkerGroup``, as ``bench/engine.py`` does); its rate is the
jobs over first ``job.started`` to last ``job.succeeded`` (the events). Each
checkout runs from its own directory, with ``PYTHONPATH`` naming it first and
a ``sitecustomize`` that drops the editable install's import finders, so a
worktree's code wins over ``/work/main``'s; the jobs are enqueued by a child
process of the same checkout. Rounds alternate their order (ABBA); figures
are medians over the rounds. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from engine import PACKAGES  # noqa: E402
from peers import (  # noqa: E402
    BACKENDS_SQL,
    DRIVER_NAME,
    LOG_DIR,
    WorkerGroup,
    dsn_for,
    ensure_database,
    median,
    percentile,
    python,
)

PLAIN_QUEUE = "bench"
KEYED_QUEUE = "bench_keyed"
KEY_FAMILY = "k"
PROCESSES = 2
ALWAYS_TRUNCATED = (
    "controlplane_jobevent",
    "controlplane_batchreceipt",
    "controlplane_batchmessage",
    "controlplane_job",
)
FLOW_TABLES = ("controlplane_flowkey", "controlplane_fairlane")

# Drops the editable install's finders: the checkout on PYTHONPATH is the one imported.
SITECUSTOMIZE = """\
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""

# Run by the checkout under test: enqueues ``plan`` = [[queue, count, key or None, modulo], ...],
# each entry in its own transaction, in order ("{i}" in a key: the job's index modulo).
ENQUEUE = """\
import json, sys
import django
django.setup()
from django.db import transaction
from jobs.enqueue import JobSpec, enqueue_many
for queue, count, key, modulo in json.loads(sys.argv[1]):
    with transaction.atomic():
        for start in range(0, count, 1000):
            specs = []
            for i in range(start, min(count, start + 1000)):
                if key is None:
                    specs.append(JobSpec("ping", {}, queue=queue))
                else:
                    specs.append(JobSpec("ping", {}, queue=queue, keys=[key.format(i=i % modulo)]))
            enqueue_many(specs)
"""

SET_LIMIT = """\
import sys
import django
django.setup()
from jobs.operator_actions import set_key_limits
set_key_limits(sys.argv[1], {"concurrency": int(sys.argv[2])})
"""


@dataclass
class Side:
    """One checkout, its own database, and how to run its code."""

    name: str
    project: Path
    database: str
    site: Path
    keyed: bool  # has flow keys (the "before" checkout has not)

    @property
    def url(self) -> str:
        return dsn_for(self.database).replace("postgresql://", "postgres://", 1)

    def env(self) -> dict[str, str]:
        paths = [self.site, self.project, self.project / "clients" / "python"]
        return {
            "PYTHONPATH": os.pathsep.join(str(p) for p in paths),
            "DATABASE_URL": self.url,
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "CONTROLPLANE_POLL_SECONDS": "2",
            "DJANGO_SECRET_KEY": "bench-flow-keys-" + "x" * 40,
        }

    def run(self, *argv: str) -> None:
        subprocess.run(
            [python(), *argv], cwd=self.project, env={**os.environ, **self.env()}, check=True
        )

    def setup(self) -> None:
        ensure_database(self.database, fresh=True)
        self.run("manage.py", "migrate", "--no-input", "-v", "0")
        subprocess.run(
            [python(), "-m", "compileall", "-q", "manage.py", *PACKAGES],
            cwd=self.project,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if self.keyed:
            self.run("-c", SET_LIMIT, KEY_FAMILY, "1")

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(
            dsn_for(self.database), autocommit=True, application_name=DRIVER_NAME
        )

    def sql(self, statement: str, params: list | None = None) -> list[tuple]:
        with self.connect() as conn:
            cursor = conn.execute(statement, params or [])
            return cursor.fetchall() if cursor.description else []

    def reset(self) -> None:
        tables = list(ALWAYS_TRUNCATED)
        if self.keyed:
            tables += FLOW_TABLES
        self.sql(f"TRUNCATE {', '.join(tables)} CASCADE")
        self.sql("DELETE FROM controlplane_worker")
        self.sql(
            "DELETE FROM controlplane_queue WHERE name = ANY(%s)", [[PLAIN_QUEUE, KEYED_QUEUE]]
        )

    def enqueue(self, plan: list[list]) -> None:
        self.run("-c", ENQUEUE, json.dumps(plan))

    def workers(self, queue: str, concurrency: int) -> WorkerGroup:
        argv = [python(), "manage.py", "runworker", "--queue", queue]
        argv += ["--concurrency", str(concurrency)]
        group = WorkerGroup(
            f"{self.name}-{queue}", [argv] * PROCESSES, env=self.env(), cwd=self.project
        )
        deadline = time.monotonic() + 90
        while self.sql("SELECT count(*) FROM controlplane_worker")[0][0] < PROCESSES:
            group.check_alive()
            if time.monotonic() > deadline:
                group.stop()
                raise RuntimeError(f"{self.name}: workers not ready after 90 s (logs in {LOG_DIR})")
            time.sleep(0.1)
        time.sleep(1.0)  # let LISTEN connections settle
        return group

    def wait(self, done, group: WorkerGroup, *, stall_seconds: float = 60.0) -> None:
        """Wait until ``done()`` is true; fail when progress stalls or a worker dies."""
        last, last_change = None, time.monotonic()
        while True:
            finished, progress = done()
            if finished:
                return
            if progress != last:
                last, last_change = progress, time.monotonic()
            elif time.monotonic() - last_change > stall_seconds:
                raise RuntimeError(f"{self.name}: stalled at {progress} (logs in {LOG_DIR})")
            group.check_alive()
            time.sleep(0.2)

    def succeeded(self) -> int:
        return self.sql("SELECT count(*) FROM controlplane_job WHERE status = 'succeeded'")[0][0]

    def backends(self) -> list[int]:
        return [r[0] for r in self.sql(BACKENDS_SQL)]


def cpu_used(group: WorkerGroup, side: Side, before: dict) -> float:
    after = group.cpu(side.backends())
    return sum(value - before.get(key, 0.0) for key, value in after.items())


# --- targets 1 and 2: drains ---------------------------------------------------------


def drain(side: Side, jobs: int, *, keys: int, concurrency: int) -> dict[str, float]:
    """Drain ``jobs`` pings (over ``keys`` keys of family ``k`` when > 0); rate and CPU."""
    side.reset()
    queue = KEYED_QUEUE if keys else PLAIN_QUEUE
    group = side.workers(queue, concurrency)
    try:
        cpu_before = group.cpu(side.backends())
        side.enqueue([[queue, jobs, f"{KEY_FAMILY}:{{i}}" if keys else None, max(keys, 1)]])
        side.wait(lambda: ((n := side.succeeded()) >= jobs, n), group)
        cpu = cpu_used(group, side, cpu_before)
    finally:
        group.stop()
    count, first, last, started = side.sql(
        "SELECT count(*) FILTER (WHERE event = 'job.succeeded'), "
        "min(ts) FILTER (WHERE event = 'job.started'), "
        "max(ts) FILTER (WHERE event = 'job.succeeded'), "
        "count(*) FILTER (WHERE event = 'job.started') FROM controlplane_jobevent"
    )[0]
    if count != jobs or started != jobs:
        raise RuntimeError(f"{side.name}: {started} started, {count} succeeded of {jobs}")
    seconds = (last - first).total_seconds()
    result = {"rate": jobs / seconds, "cpu_ms": cpu * 1000 / jobs}
    if keys:
        result["overlap"] = most_at_once(side)
        result["jobs_per_claim"] = (
            jobs
            / side.sql("SELECT count(DISTINCT (worker_id, started_at)) FROM controlplane_job")[0][0]
        )
    return result


def most_at_once(side: Side) -> int:
    """The most jobs of one key ever running together (start to finish, from the job rows)."""
    rows = side.sql(
        "SELECT fair_key, started_at, finished_at FROM controlplane_job ORDER BY fair_key"
    )
    edges: dict[str, list[tuple]] = {}
    for key, started, finished in rows:
        edges.setdefault(key, []).extend([(started, 1), (finished, -1)])
    worst = 0
    for marks in edges.values():
        running = 0
        for _, step in sorted(marks, key=lambda m: (m[0], m[1])):  # an end before a start
            running += step
            worst = max(worst, running)
    return worst


# --- target 3: fairness --------------------------------------------------------------


def fairness(side: Side, backlog: int, late: int, concurrency: int) -> dict[str, float]:
    """A's backlog committed, then B's jobs: A's finished before B's last, and B's p95 wait."""
    side.reset()
    group = side.workers(KEYED_QUEUE, concurrency)
    try:
        side.enqueue([[KEYED_QUEUE, backlog, "A", 1], [KEYED_QUEUE, late, "B", 1]])

        def b_done() -> tuple[bool, int]:
            n = side.sql(
                "SELECT count(*) FROM controlplane_job "
                "WHERE fair_key = 'B' AND status = 'succeeded'"
            )[0][0]
            return n >= late, n

        side.wait(b_done, group)
    finally:
        group.stop()
    (b_last,) = side.sql("SELECT max(finished_at) FROM controlplane_job WHERE fair_key = 'B'")[0]
    (a_before,) = side.sql(
        "SELECT count(*) FROM controlplane_job WHERE fair_key = 'A' AND status = 'succeeded' "
        "AND finished_at < %s",
        [b_last],
    )[0]
    return {"a_before_b_last": a_before, "b_p95_ms": b_wait_p95(side)}


def alone(side: Side, late: int, concurrency: int) -> float:
    """B's p95 wait with ``late`` B jobs on an empty queue."""
    side.reset()
    group = side.workers(KEYED_QUEUE, concurrency)
    try:
        side.enqueue([[KEYED_QUEUE, late, "B", 1]])
        side.wait(lambda: ((n := side.succeeded()) >= late, n), group)
    finally:
        group.stop()
    return b_wait_p95(side)


def b_wait_p95(side: Side) -> float:
    waits = [
        r[0]
        for r in side.sql(
            "SELECT extract(epoch FROM started_at - created_at) * 1000 FROM controlplane_job "
            "WHERE fair_key = 'B'"
        )
    ]
    return percentile([float(w) for w in waits], 95)


# --- the run -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="checkout before flow keys (target 1)")
    parser.add_argument("--after", type=Path, default=BENCH_DIR.parent, help="checkout measured")
    parser.add_argument("--rounds", type=int, default=4, help="drain rounds (ABBA order)")
    parser.add_argument("--fair-rounds", type=int, default=3, help="fairness rounds (0 skips)")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=50000)
    parser.add_argument("--late", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another checkout whose keyed drain runs in every round (A/B of a change)",
    )
    parser.add_argument("--skip", default="", help="comma list of: plain-before, keyed")
    args = parser.parse_args()

    site = Path(tempfile.mkdtemp(prefix="bench-flow-keys-site-"))
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    print(f"worker logs in {LOG_DIR}", flush=True)
    after = Side("after", args.after.resolve(), "bench_flow_after", site, keyed=True)
    before = (
        Side("before", args.before.resolve(), "bench_flow_before", site, keyed=False)
        if args.before
        else None
    )
    skip = set(filter(None, args.skip.split(",")))
    others = []
    for spec in args.also:
        name, _, path = spec.partition("=")
        others.append(Side(name, Path(path).resolve(), f"bench_flow_{name}", site, keyed=True))
    for side in filter(None, [before, after, *others]):
        side.setup()

    variants = []
    if before and "plain-before" not in skip:
        variants.append(
            (
                "before, unkeyed",
                lambda: drain(before, args.jobs, keys=0, concurrency=args.concurrency),
            )
        )
    variants.append(
        ("after, unkeyed", lambda: drain(after, args.jobs, keys=0, concurrency=args.concurrency))
    )
    if "keyed" not in skip:
        variants.append(
            (
                "after, keyed",
                lambda: drain(after, args.jobs, keys=args.keys, concurrency=args.concurrency),
            )
        )
    for other in others:
        variants.append(
            (
                f"{other.name}, keyed",
                lambda o=other: drain(o, args.jobs, keys=args.keys, concurrency=args.concurrency),
            )
        )
    results: dict[str, list[dict]] = {name: [] for name, _ in variants}
    for round_no in range(args.rounds):
        order = variants if round_no % 4 in (0, 3) else variants[::-1]  # ABBA
        for name, run in order:
            figures = run()
            results[name].append(figures)
            shown = ", ".join(f"{k} {v:,.2f}" for k, v in figures.items())
            print(f"round {round_no + 1} {name}: {shown}", flush=True)

    print("\n| drain, 2 processes x 32 | median jobs/s | runs | CPU ms/job (median) |")
    print("|---|---:|---|---:|")
    for name, runs in results.items():
        rates = [r["rate"] for r in runs]
        print(
            f"| {name} | {median(rates):,.0f} | {', '.join(f'{r:,.0f}' for r in rates)} "
            f"| {median([r['cpu_ms'] for r in runs]):.3f} |"
        )

    def compare(name: str, a: str, b: str, floor: float | None, rule: str) -> None:
        if a not in results or b not in results:
            return
        overall = median([r["rate"] for r in results[a]]) / median([r["rate"] for r in results[b]])
        per_round = [x["rate"] / y["rate"] for x, y in zip(results[a], results[b], strict=True)]
        verdict = "" if floor is None else ("PASS" if overall >= floor else "MISS") + " "
        print(
            f"{name}: {a} / {b} = {overall:.3f} on the medians; per round "
            f"{', '.join(f'{r:.2f}' for r in per_round)} (median {median(per_round):.3f}); "
            f"{verdict}{rule}"
        )

    compare("target 1", "after, unkeyed", "before, unkeyed", 0.97, "(target: within 3%)")
    compare("target 2", "after, keyed", "after, unkeyed", 0.8, "(target: >= 0.8)")
    for other in others:
        compare(other.name, f"{other.name}, keyed", "after, unkeyed", None, "keyed / unkeyed")
    if results.get("after, keyed"):
        worst = max(r["overlap"] for r in results["after, keyed"])
        print(f"most jobs of one key running at once: {worst} (limit 1)")

    fair, empty = [], []
    for round_no in range(args.fair_rounds):
        steps = [
            (
                "backlog",
                lambda: fair.append(fairness(after, args.backlog, args.late, args.concurrency)),
            ),
            ("alone", lambda: empty.append(alone(after, args.late, args.concurrency))),
        ]
        for name, step in steps if round_no % 2 == 0 else steps[::-1]:
            step()
            shown = fair[-1] if name == "backlog" else {"b_p95_ms": empty[-1]}
            print(f"fairness round {round_no + 1} {name}: {shown}", flush=True)
    if fair:
        a_counts = [f["a_before_b_last"] for f in fair]
        b_backlog = median([f["b_p95_ms"] for f in fair])
        b_alone = median(empty)
        print(
            f"target 3: A finished before B's last: {', '.join(str(a) for a in a_counts)} "
            f"(pass < 2,000); B p95 wait behind the backlog {b_backlog:.0f} ms, alone "
            f"{b_alone:.0f} ms, ratio {b_backlog / b_alone:.2f} (pass <= 2)"
        )


if __name__ == "__main__":
    main()
