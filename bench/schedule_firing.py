"""Schedule firing at scale: 1,000 due every-second schedules, fired by one call and by one
reaper pass.

    .venv/bin/python bench/schedule_firing.py [--schedules 1000] [--runs 3] [--profile]

``DATABASE_URL`` selects the database (default
postgres://postgres@127.0.0.1:5432/bench_firing); it is created if missing and
migrated. Each run starts from no schedules, makes ``--schedules`` every-second
schedules all one second overdue, then prints:

- ``fire_due_schedules`` with no time budget: how long firing them all takes,
  and the statements per fire;
- a reaper pass (``Reaper.run_once``) with the default ``SCHEDULE_FIRE_BUDGET_SECONDS``:
  how long the pass took and how many it left to the next pass (the budget
  hands those on instead of holding the reaper).

Each figure is the median of the runs. ``--profile`` prints the functions that
took the most time in one unbounded firing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from enqueue import ensure_database, setup  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/bench_firing"
QUEUE = "bench-firing"


def make_due(count: int) -> None:
    """``count`` every-second schedules, each one second overdue (the old ones deleted)."""
    from jobs.clock import db_now
    from jobs.models import Schedule
    from jobs.schedules.services import create_schedule

    Schedule.objects.all().delete()
    for i in range(count):
        create_schedule(
            {"name": f"bench-{i}", "operation": "ping", "every_seconds": 1, "queue": QUEUE}
        )
    Schedule.objects.update(next_fire_at=db_now() - timedelta(seconds=1))


def time_firing(count: int) -> tuple[float, float]:
    """Seconds to fire ``count`` due schedules with no budget, and statements per fire."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.schedules.firing import fire_due_schedules

    make_due(count)
    start = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        result = fire_due_schedules(budget=0)
    took = time.monotonic() - start
    return took, len(queries) / max(1, result.fired)


def time_reaper_pass(count: int) -> tuple[float, int]:
    """Seconds of one reaper pass over ``count`` due schedules, and how many it fired."""
    from workers.reaper import Reaper

    make_due(count)
    reaper = Reaper()
    reaper._schedules_synced = True  # no declared schedules to sync: time the firing only
    start = time.monotonic()
    result = reaper.run_once()
    return time.monotonic() - start, result.schedules_fired


def profile_firing(count: int) -> None:
    import cProfile
    import pstats

    from jobs.schedules.firing import fire_due_schedules

    make_due(count)
    profiler = cProfile.Profile()
    profiler.enable()
    fire_due_schedules(budget=0)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    ensure_database(url)
    setup(url)
    if args.profile:
        profile_firing(args.schedules)
        return
    firing = [time_firing(args.schedules) for _ in range(args.runs)]
    passes = [time_reaper_pass(args.schedules) for _ in range(args.runs)]
    print(
        f"fire_due_schedules, {args.schedules} due, no budget: "
        f"median {statistics.median(t for t, _ in firing):.2f} s, "
        f"{statistics.median(s for _, s in firing):.1f} statements per fire "
        f"({args.runs} runs)"
    )
    fired = statistics.median(f for _, f in passes)
    took = statistics.median(t for t, _ in passes)
    print(
        f"reaper pass, {args.schedules} due: median {took:.2f} s, "
        f"fired {fired:.0f}, left to the next pass {args.schedules - fired:.0f} ({args.runs} runs)"
    )


if __name__ == "__main__":
    main()
