"""Real ``manage.py reaper`` processes fire schedules: two at once fire each slot exactly once.

Also: the reaper syncs the schedules declared in code when it starts, and
retention deletes old scheduled jobs while their fire records stay.
"""

from __future__ import annotations

import re
import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from django_controlplane.testing import assert_enqueued, drain_jobs, enqueued_jobs
from jobs.clock import db_now
from jobs.conf import DEFAULTS
from jobs.models import Job, JobEvent, Schedule, ScheduleFire
from jobs.schedules.firing import fire_due_schedules
from jobs.schedules.services import create_schedule, pause_schedule
from tests.conftest import wait_for
from tests.factories import unique_queue
from workers.reaper import Reaper, delete_finished_jobs

from .conftest import fires

pytestmark = pytest.mark.django_db(transaction=True)

SLOTS = 12
DECLARING = {
    "CONTROLPLANE_OPERATION_MODULES": ",".join(
        [*DEFAULTS["OPERATION_MODULES"], "tests.integration.schedules.scheduled_ops"]
    )
}


def fired_in_log(output: str) -> int:
    """Jobs a reaper's log says it fired, in passes and between them."""
    between = re.findall(r"reaper\.schedules fired=(\d+)", output)
    passes = re.findall(r"reaper\.pass .*?\bschedules_fired=(\d+)", output)
    return sum(int(n) for n in between + passes)


def test_two_reapers_fire_each_slot_of_an_every_second_schedule_exactly_once(start_process):
    schedule = create_schedule(
        {"operation": "ping", "every_seconds": 1, "catch_up": "all", "queue": unique_queue()}
    )
    # Passes 30 s apart: the fires between them come from each reaper's FireTimer.
    reapers = [start_process("reaper", "--interval", "30") for _ in range(2)]
    wait_for(
        lambda: ScheduleFire.objects.filter(schedule=schedule).count() >= SLOTS,
        timeout=SLOTS + 30,
        message=f"{SLOTS} fires",
    )
    for reaper in reapers:
        reaper.signal(signal.SIGTERM)
    for reaper in reapers:
        assert reaper.wait(timeout=20) == 0, reaper.output()
    rows = fires(schedule)
    slots = [row[0] for row in rows]
    # One row per slot: consecutive whole seconds, none missing, none twice.
    assert len(slots) >= SLOTS
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    assert all(outcome == "enqueued" and job for _, outcome, job in rows), rows
    # One job per slot, and no job without its slot.
    jobs = enqueued_jobs(schedule=schedule)
    assert sorted(str(j.pk) for j in jobs) == sorted(str(row[2]) for row in rows)
    stamped = JobEvent.objects.filter(job__schedule=schedule, seq=1).values_list(
        "fields__fire_at", flat=True
    )
    assert sorted(stamped) == sorted(slot.isoformat() for slot in slots)
    # The two logs account for every job between them.
    assert sum(fired_in_log(r.output()) for r in reapers) == len(jobs)
    # On time: from the timers, not the passes (those would leave a median lag of about
    # 15 s). The bound is loose on purpose: a loaded 2-core machine delays a timer by 1 s.
    late = sorted(
        (fired_at - fire_at).total_seconds()
        for fire_at, fired_at in ScheduleFire.objects.filter(schedule=schedule).values_list(
            "fire_at", "fired_at"
        )
    )
    assert late[0] >= 0 and late[len(late) // 2] < 5, late


def test_the_reaper_syncs_schedules_declared_in_code_when_it_starts(start_process):
    assert start_process("reaper", "--once", env=DECLARING).wait(timeout=60) == 0
    row = Schedule.objects.get(name="test.scheduled_hourly")
    assert (row.source, row.operation, row.every_seconds, row.catch_up, row.overlap) == (
        "code",
        "test.scheduled_hourly",
        3600.0,
        "none",
        "skip",
    )
    assert timezone.now() < row.next_fire_at <= timezone.now() + timedelta(hours=1)
    # An operator's pause outlives a restart.
    pause_schedule(row.pk)
    assert start_process("reaper", "--once", env=DECLARING).wait(timeout=60) == 0
    assert Schedule.objects.get(pk=row.pk).paused
    # Gone from the code (the module is not loaded): the next start deletes it.
    assert start_process("reaper", "--once").wait(timeout=60) == 0
    assert not Schedule.objects.filter(name="test.scheduled_hourly").exists()


def test_a_reaper_pass_fires_what_is_due():
    schedule = create_schedule({"operation": "ping", "every_seconds": 1, "queue": unique_queue()})
    wait_for(lambda: schedule.next_fire_at <= db_now(), message="the first slot")
    result = Reaper().run_once()
    assert result.schedules_fired == 1 and result.errors == 0
    assert_enqueued("ping", queue=schedule.queue, schedule=schedule, count=1)


def test_retention_deletes_old_scheduled_jobs_and_keeps_their_fire_records():
    schedule = create_schedule({"operation": "ping", "every_seconds": 60, "queue": unique_queue()})
    slot = schedule.next_fire_at
    fire_due_schedules(slot)
    [job] = assert_enqueued(schedule=schedule, count=1)
    assert drain_jobs(queues=[job.queue]).counts == {"succeeded": 1}
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=30))
    # Committed on its own (this test runs outside a transaction): the foreign key is checked.
    assert delete_finished_jobs(timezone.now() - timedelta(days=7), 100) == 1
    assert not Job.objects.filter(pk=job.pk).exists()
    assert fires(schedule) == [(slot, "enqueued", None)]
