"""Workers and a reaper whose clocks are 45 s off agree through the database's clock.

Real ``runworker`` and ``reaper`` processes run under libfaketime (Debian's
``faketime``: the wall clock shifted, the monotonic clock left alone): a
worker 45 s slow, one 45 s fast and a reaper 45 s fast. With leases, run
times, timeouts, schedule slots and event times taken from the database,
no live job is revoked, none fails, a job due in 3 s does not start early,
every timeline's seq order is its time order and a schedule fires each slot
once, on time. PostgreSQL only (SQLite is one machine); without faketime
the test is skipped, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Schedule, ScheduleFire
from jobs.schedules.timing import Timing
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SITE = Path(__file__).parent / "faketime_site"  # time.sleep that works under faketime
SKEW = 45
SLEEP_SECONDS = 4.0  # longer than the 3 s lease (FAST_KNOBS): the heartbeat must extend it
EVERY = 2.0  # the schedule's period


@pytest.fixture(autouse=True)
def _postgres_and_faketime():
    if connection.vendor != "postgresql":
        pytest.skip("clock skew across machines: PostgreSQL only (SQLite is one machine)")
    if not FAKETIME_LIB.exists():
        message = f"{FAKETIME_LIB} is missing: apt-get install faketime"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def skewed(seconds: int) -> dict[str, str]:
    """The environment of a process whose wall clock is ``seconds`` off (monotonic intact)."""
    path = os.environ.get("PYTHONPATH")
    return {
        "LD_PRELOAD": str(FAKETIME_LIB),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{SITE}{os.pathsep}{path}" if path else str(SITE),
    }


def test_workers_and_a_reaper_45_s_off_agree_through_the_database_clock(worker, start_process):
    slow_q, fast_q = (f"{name}-{uuid.uuid4().hex[:6]}" for name in ("slow", "fast"))
    slow = worker(slow_q, args=("--concurrency", "4"), env=skewed(-SKEW))
    fast = worker(fast_q, args=("--concurrency", "6"), env=skewed(SKEW))
    reaper = start_process("reaper", "--interval", "0.3", env=skewed(SKEW))
    for proc in (slow, fast):
        wait_for(lambda p=proc: "worker.started" in p.output(), message="worker ready")
    wait_for(lambda: "reaper.pass" in reaper.output(), message="reaper passing")

    # The slow worker's jobs are due long ago even by its clock: it claims them at once.
    long_ago = timezone.now() - timedelta(seconds=2 * SKEW)
    sleeps = [
        enqueue("sleep", {"seconds": SLEEP_SECONDS, "emit_every": 0.5}, queue=q, run_after=at)
        for q, at in [(slow_q, long_ago)] * 4 + [(fast_q, None)] * 4
    ]
    due = timezone.now() + timedelta(seconds=3)
    later = enqueue("ping", {}, queue=fast_q, run_after=due)
    timing = Timing("", EVERY, "UTC")
    schedule = Schedule.objects.create(
        name=f"skew-{uuid.uuid4().hex[:6]}",
        operation="ping",
        queue=fast_q,
        every_seconds=EVERY,
        next_fire_at=timing.next_after(timezone.now() + timedelta(seconds=1)),
    )

    # Watch for 10 s (this process's clock is the database's: one machine).
    later_seen: float | None = None
    fires_seen: dict[int, float] = {}
    end = time.monotonic() + 10
    while time.monotonic() < end:
        now = timezone.now().timestamp()
        if later_seen is None and Job.objects.filter(pk=later.pk).exclude(status="queued").exists():
            later_seen = now
        for fire_id in ScheduleFire.objects.filter(schedule=schedule).values_list("pk", flat=True):
            fires_seen.setdefault(fire_id, now)
        time.sleep(0.02)

    ids = [j.pk for j in sleeps]
    finished = Job.objects.filter(pk__in=ids, status__in=("succeeded", "failed"))
    end = time.monotonic() + 30  # then the counts below say what went wrong
    while finished.count() < len(ids) and time.monotonic() < end:
        time.sleep(0.1)

    # No early run: the job due in 3 s started no sooner, by the database's clock too.
    assert later_seen is not None, "the delayed job never started"
    assert later_seen >= due.timestamp(), f"started {due.timestamp() - later_seen:.1f} s early"
    started = JobEvent.objects.get(job_id=later.pk, event="job.started").ts
    assert started >= due

    # No revoked live job, no wrongful failure.
    revoked = JobEvent.objects.filter(
        job_id__in=ids, event__in=("job.lease_expired_requeue", "job.lease_expired")
    ).count()
    starts = JobEvent.objects.filter(job_id__in=ids, event="job.started").count()
    statuses = sorted(Job.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert (revoked, starts, statuses) == (0, 8, ["succeeded"] * 8)
    assert "job.lease_lost" not in slow.output() + fast.output()

    # The schedule fired each slot once, on time (never early, never merged).
    fires = list(
        ScheduleFire.objects.filter(schedule=schedule)
        .order_by("fire_at")
        .values_list("pk", "fire_at", "fired_at")
    )
    assert len(fires) >= 4, fires
    for (_, a, _), (_, b, _) in zip(fires, fires[1:], strict=False):
        assert (b - a).total_seconds() == EVERY, f"slots {a} and {b} are not one period apart"
    for fire_id, fire_at, fired_at in fires:
        assert 0 <= (fired_at - fire_at).total_seconds() < 1.5, (fire_at, fired_at)
        seen = fires_seen.get(fire_id)
        if seen is not None:  # the last one may have come after the watch
            assert seen >= fire_at.timestamp(), f"slot {fire_at} fired early"

    # Timelines: seq order is time order, from the enqueue on.
    scheduled = list(Job.objects.filter(schedule_id=schedule.pk).values_list("pk", flat=True))
    for job in Job.objects.filter(pk__in=[*ids, later.pk, *scheduled]):
        events = list(JobEvent.objects.filter(job_id=job.pk).order_by("seq"))
        times = [job.created_at, *(e.ts for e in events)]
        assert times == sorted(times), [(e.seq, e.event, e.ts.isoformat()) for e in events]

    # Each skewed process said so.
    for proc in (slow, fast, reaper):
        assert "clock.skew" in proc.output()
