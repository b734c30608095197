"""Skewed clocks: a worker 45 s slow, a worker 45 s fast and a reaper 45 s fast, under faketime.

    .venv/bin/python bench/clock_skew.py [--skew 45] [--jobs 40] [--seconds 60] [--knob N=V …]

Real ``runworker`` and ``reaper`` processes run with their wall clock
shifted by Debian's libfaketime (``FAKETIME_DONT_FAKE_MONOTONIC=1``); this
process, on the database's host, keeps the true clock. Half the ``sleep``
jobs (8 s each, due long ago) go to the slow worker's queue, half to the
fast one's; ten pings are due 5 to 30 s ahead; a schedule fires every 5 s.
It prints what the skew cost:

- revoked: lease rescues (``job.lease_expired_requeue`` / ``job.lease_expired``)
  of jobs whose worker was alive;
- failed: jobs that ended ``failed``;
- early: delayed jobs seen started before they were due (polled every 20 ms);
- unordered: timelines whose seq order is not their time order;
- schedule: slots fired, fired early, and gaps of more than one period.

Knobs are the product's defaults (lease 30 s, heartbeat 10 s) but the
reaper runs every second. PostgreSQL only (``BENCH_ADMIN_DSN``); the
database ``--database`` (default ``bench_clock_skew``) is made afresh.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
PROJECT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(PROJECT))

from peers import LOG_DIR, dsn_for, ensure_database, python  # noqa: E402

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SITE = PROJECT / "tests" / "integration" / "engine" / "faketime_site"
EVERY = 5.0


def skewed(env: dict[str, str], seconds: int) -> dict[str, str]:
    path = env.get("PYTHONPATH")
    return {
        **env,
        "LD_PRELOAD": FAKETIME_LIB,
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{SITE}{os.pathsep}{path}" if path else str(SITE),
    }


def spawn(args: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
    log = (LOG_DIR / f"{name}.log").open("wb")
    return subprocess.Popen(
        [python(), str(PROJECT / "manage.py"), *args],
        cwd=PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skew", type=int, default=45)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch")
    parser.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--database", default="bench_clock_skew")
    args = parser.parse_args()
    if not Path(FAKETIME_LIB).exists():
        sys.exit(f"{FAKETIME_LIB} is missing: apt-get install faketime")

    ensure_database(args.database, fresh=True)
    url = dsn_for(args.database).replace("postgresql://", "postgres://", 1)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
        "CONTROLPLANE_REAPER_INTERVAL_SECONDS": "1",
    }
    for item in args.knob:
        key, _, value = item.partition("=")
        env[f"CONTROLPLANE_{key.upper()}"] = value
    subprocess.run(
        [python(), "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=PROJECT,
        env=env,
        check=True,
    )
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.utils import timezone

    from jobs.enqueue import enqueue
    from jobs.models import Job, JobEvent, Schedule, ScheduleFire
    from jobs.schedules.timing import Timing

    skew = args.skew
    procs = [
        spawn(["runworker", "--queue", "slow", "--concurrency", "20"], skewed(env, -skew), "slow"),
        spawn(["runworker", "--queue", "fast", "--concurrency", "20"], skewed(env, skew), "fast"),
        spawn(["reaper"], skewed(env, skew), "reaper"),
    ]
    time.sleep(3)
    started = time.monotonic()
    now = timezone.now()
    half = args.jobs // 2
    # The slow worker's jobs were due long ago even by its clock: it claims them at once.
    long_ago = now - timedelta(seconds=2 * skew)
    sleeps = [
        enqueue("sleep", {"seconds": 8}, queue=q, run_after=at).pk
        for q, at in [("slow", long_ago)] * half + [("fast", None)] * half
    ]
    delayed = {
        enqueue("ping", {}, queue="fast", run_after=now + timedelta(seconds=s)).pk: now
        + timedelta(seconds=s)
        for s in range(5, 31, 3)
    }
    schedule = Schedule.objects.create(
        name="skewed",
        operation="ping",
        queue="fast",
        every_seconds=EVERY,
        next_fire_at=Timing("", EVERY, "UTC").next_after(now + timedelta(seconds=2)),
    )
    seen_started: dict[object, float] = {}
    seen_fired: dict[int, float] = {}
    while time.monotonic() - started < args.seconds:
        t = timezone.now().timestamp()
        for pk in (
            Job.objects.filter(pk__in=list(delayed))
            .exclude(status="queued")
            .values_list("pk", flat=True)
        ):
            seen_started.setdefault(pk, t)
        for pk in ScheduleFire.objects.filter(schedule=schedule).values_list("pk", flat=True):
            seen_fired.setdefault(pk, t)
        time.sleep(0.02)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()

    revoked = JobEvent.objects.filter(
        event__in=("job.lease_expired_requeue", "job.lease_expired")
    ).count()
    failed = Job.objects.filter(status="failed").count()
    done = Job.objects.filter(pk__in=sleeps, status="succeeded").count()
    early = sum(1 for pk, t in seen_started.items() if t < delayed[pk].timestamp())
    unordered = 0
    for job in Job.objects.all():
        times = [
            job.created_at,
            *JobEvent.objects.filter(job=job).order_by("seq").values_list("ts", flat=True),
        ]
        unordered += times != sorted(times)
    fires = list(
        ScheduleFire.objects.filter(schedule=schedule)
        .order_by("fire_at")
        .values_list("pk", "fire_at")
    )
    fired_early = sum(1 for pk, at in fires if seen_fired.get(pk, 1e18) < at.timestamp())
    gaps = sum(
        1
        for (_, a), (_, b) in zip(fires, fires[1:], strict=False)
        if (b - a).total_seconds() > EVERY
    )
    print(
        f"skew ±{skew} s, {args.jobs} sleep jobs of 8 s, watched {args.seconds:g} s "
        f"(logs {LOG_DIR})"
    )
    print(f"  sleep jobs succeeded: {done}/{len(sleeps)}")
    print(f"  revoked: {revoked}  failed: {failed}  early: {early}/{len(delayed)}")
    print(f"  unordered timelines: {unordered}/{Job.objects.count()}")
    print(f"  schedule: {len(fires)} slots fired, {fired_early} early, {gaps} gaps > {EVERY:g} s")


if __name__ == "__main__":
    main()
