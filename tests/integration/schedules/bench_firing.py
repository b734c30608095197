"""Bench, not a test (run it by path): one reaper pass with 1,000 due every-second schedules.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test CONTROLPLANE_TEST_DB_NAME=test_bench \
        .venv/bin/python -m pytest tests/integration/schedules/bench_firing.py -q -s

Prints how long the pass's firing took, how many it fired, and the statements per fire.
"""

from __future__ import annotations

import inspect
import os
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.clock import db_now
from jobs.models import Schedule
from jobs.schedules.firing import fire_due_schedules
from jobs.schedules.services import create_schedule
from tests.factories import unique_queue
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)

COUNT = int(os.environ.get("BENCH_SCHEDULES", "1000"))
# Unbounded, to time the firing itself (versions without a budget take no argument).
UNBOUNDED = {"budget": 0} if "budget" in inspect.signature(fire_due_schedules).parameters else {}


def make_due(count: int) -> None:
    queue = unique_queue()
    for i in range(count):
        create_schedule(
            {"name": f"bench-{i}", "operation": "ping", "every_seconds": 1, "queue": queue}
        )
    Schedule.objects.update(next_fire_at=db_now() - timedelta(seconds=1))


def test_bench_fire_due_schedules():
    make_due(COUNT)
    start = time.monotonic()
    with CaptureQueriesContext(connection) as queries:
        result = fire_due_schedules(**UNBOUNDED)
    took = time.monotonic() - start
    print(
        f"\nfire_due_schedules: {COUNT} due -> {result} in {took:.2f} s, "
        f"{len(queries) / max(1, result.fired):.1f} statements per fire"
    )


def test_bench_reaper_pass():
    make_due(COUNT)
    reaper = Reaper()
    reaper._schedules_synced = True
    start = time.monotonic()
    result = reaper.run_once()
    took = time.monotonic() - start
    left = Schedule.objects.filter(next_fire_at__lte=db_now() - timedelta(seconds=1)).count()
    print(
        f"\nreaper pass: {COUNT} due -> schedules_fired={result.schedules_fired} in {took:.2f} s "
        f"(still overdue after: {left})"
    )


def test_profile_fire():
    import cProfile
    import pstats

    make_due(COUNT)
    profiler = cProfile.Profile()
    profiler.enable()
    start = time.monotonic()
    result = fire_due_schedules(**UNBOUNDED)
    took = time.monotonic() - start
    profiler.disable()
    print(f"\nprofiled: {result} in {took:.2f} s")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
