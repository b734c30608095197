"""Firing in one process: slots claimed once, catch-up, overlap, pause/resume, run now, retention.

Time is driven by the ``now`` given to ``fire_due_schedules``: a reaper that
was away for an hour is a call with ``now`` an hour after ``next_fire_at``.
"""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from django_controlplane.testing import assert_enqueued, drain_jobs, refute_enqueued
from jobs.models import JobEvent, Schedule, ScheduleFire
from jobs.operations import operation, registry
from jobs.schedules.firing import ENQUEUE_FAILED, claim_slot, fire_due_schedules, prune_fires
from jobs.schedules.services import (
    delete_schedule,
    pause_schedule,
    resume_schedule,
    run_schedule_now,
)

from .conftest import fires

pytestmark = pytest.mark.django_db


def fresh(schedule: Schedule) -> Schedule:
    return Schedule.objects.get(pk=schedule.pk)


def test_a_due_slot_fires_one_job_that_names_its_schedule(make_schedule):
    schedule = make_schedule(every_seconds=60, payload={}, priority=5)
    slot = schedule.next_fire_at
    assert slot > timezone.now() and slot.second == 0 and slot.microsecond == 0
    assert fire_due_schedules(slot - timedelta(microseconds=1)).fired == 0
    result = fire_due_schedules(slot)
    assert result.fired == 1
    [job] = assert_enqueued("ping", queue=schedule.queue, schedule=schedule, count=1)
    assert (job.priority, job.status) == (5, "queued")
    assert fires(schedule) == [(slot, "enqueued", job.pk)]
    schedule = fresh(schedule)
    assert schedule.last_fire_at == slot
    assert schedule.next_fire_at == slot + timedelta(seconds=60)
    event = JobEvent.objects.get(job=job, seq=1)
    assert event.event == "job.enqueued"
    assert event.fields == {
        "schedule": str(schedule.pk),
        "schedule_name": schedule.name,
        "fire_at": slot.isoformat(),
    }
    # Again at the same instant: nothing is due any more.
    assert fire_due_schedules(slot).fired == 0
    assert_enqueued(schedule=schedule, count=1)


def test_a_slot_claimed_elsewhere_enqueues_nothing_here(make_schedule):
    schedule = make_schedule(every_seconds=60)
    slot = schedule.next_fire_at
    # Another reaper's row for the slot (its job lives in its own transaction).
    assert claim_slot(schedule.pk, slot, timezone.now(), "enqueued") is not None
    assert claim_slot(schedule.pk, slot, timezone.now(), "enqueued") is None
    assert fire_due_schedules(slot).fired == 0
    refute_enqueued(schedule=schedule)
    assert ScheduleFire.objects.filter(schedule=schedule).count() == 1
    assert fresh(schedule).next_fire_at == slot + timedelta(seconds=60)


def test_catch_up_one_fires_once_for_every_missed_slot(make_schedule):
    schedule = make_schedule(every_seconds=60)
    first = schedule.next_fire_at
    now = first + timedelta(minutes=30, seconds=10)  # 31 slots went by
    assert fire_due_schedules(now).fired == 1
    assert [f[0] for f in fires(schedule)] == [first + timedelta(minutes=30)]
    assert fresh(schedule).next_fire_at == first + timedelta(minutes=31)


def test_catch_up_none_skips_what_is_late_past_the_grace(make_schedule, settings):
    settings.CONTROLPLANE = {"SCHEDULE_MISFIRE_GRACE_SECONDS": 20}
    schedule = make_schedule(every_seconds=60, catch_up="none")
    first = schedule.next_fire_at
    assert fire_due_schedules(first + timedelta(minutes=10, seconds=30)).fired == 0
    assert fires(schedule) == []
    assert fresh(schedule).next_fire_at == first + timedelta(minutes=11)
    # The next slot, seen 5 s late (within the grace), fires.
    assert fire_due_schedules(first + timedelta(minutes=11, seconds=5)).fired == 1
    assert [f[0] for f in fires(schedule)] == [first + timedelta(minutes=11)]


def test_catch_up_all_fires_each_missed_slot_up_to_the_bound(make_schedule, settings):
    settings.CONTROLPLANE = {"SCHEDULE_CATCH_UP_MAX": 5}
    schedule = make_schedule(every_seconds=60, catch_up="all")
    first = schedule.next_fire_at
    assert fire_due_schedules(first + timedelta(minutes=3)).fired == 4
    assert [f[0] for f in fires(schedule)] == [first + timedelta(minutes=m) for m in range(4)]
    # Away for an hour: the newest five slots fire, the rest are skipped.
    later = first + timedelta(minutes=63, seconds=30)
    assert fire_due_schedules(later).fired == 5
    assert [f[0] for f in fires(schedule)][4:] == [
        first + timedelta(minutes=m) for m in range(59, 64)
    ]
    assert_enqueued("ping", schedule=schedule, count=9)
    assert fresh(schedule).next_fire_at == first + timedelta(minutes=64)


def test_overlap_skip_records_the_slot_without_a_job_while_a_run_is_active(make_schedule):
    schedule = make_schedule(every_seconds=60, overlap="skip")
    first = schedule.next_fire_at
    assert fire_due_schedules(first).fired == 1
    result = fire_due_schedules(first + timedelta(minutes=1))
    assert (result.fired, result.skipped_overlap) == (0, 1)
    [job] = assert_enqueued(schedule=schedule, count=1)
    assert fires(schedule)[1] == (first + timedelta(minutes=1), "skipped_overlap", None)
    # The run ends (run here, as a worker runs it): the next slot fires again.
    assert [run.job_id for run in drain_jobs(queues=[schedule.queue]).runs] == [job.pk]
    assert fire_due_schedules(first + timedelta(minutes=2)).fired == 1
    assert [f[1] for f in fires(schedule)] == ["enqueued", "skipped_overlap", "enqueued"]


def test_overlap_skip_with_catch_up_all_fires_the_first_and_skips_the_rest(make_schedule):
    schedule = make_schedule(every_seconds=60, overlap="skip", catch_up="all")
    first = schedule.next_fire_at
    result = fire_due_schedules(first + timedelta(minutes=2))
    assert (result.fired, result.skipped_overlap) == (1, 2)


def test_overlap_allow_fires_beside_an_active_run(make_schedule):
    schedule = make_schedule(every_seconds=60)
    first = schedule.next_fire_at
    fire_due_schedules(first)
    assert fire_due_schedules(first + timedelta(minutes=1)).fired == 1
    assert_enqueued(schedule=schedule, count=2)


def test_a_paused_schedule_does_not_fire_and_resumes_without_catching_up(make_schedule):
    schedule = make_schedule(every_seconds=60, catch_up="all")
    first = schedule.next_fire_at
    pause_schedule(schedule.pk)
    assert fire_due_schedules(first + timedelta(hours=1)).fired == 0
    resumed_at = first + timedelta(hours=2, seconds=30)
    schedule = resume_schedule(schedule.pk, now=resumed_at)
    assert not schedule.paused
    assert schedule.next_fire_at == first + timedelta(hours=2, minutes=1)
    assert fire_due_schedules(resumed_at + timedelta(seconds=31)).fired == 1
    assert [f[0] for f in fires(schedule)] == [first + timedelta(hours=2, minutes=1)]


def test_run_now_fires_once_paused_or_overlapping_and_keeps_the_slots(make_schedule):
    schedule = make_schedule(every_seconds=60, overlap="skip")
    slot = schedule.next_fire_at
    pause_schedule(schedule.pk)
    first = run_schedule_now(schedule.pk)
    second = run_schedule_now(schedule.pk)  # the first is still queued: overlap does not apply
    assert first.schedule_id == second.schedule_id == schedule.pk
    assert [f[1] for f in fires(schedule)] == ["run_now", "run_now"]
    assert {f[2] for f in fires(schedule)} == {first.pk, second.pk}
    schedule = fresh(schedule)
    assert schedule.paused and schedule.next_fire_at == slot
    assert schedule.last_fire_at == fires(schedule)[-1][0]


@pytest.fixture
def vanishing_operation():
    """An operation that exists when the schedule is made and is gone when it fires."""
    operation("test.vanishing")(lambda ctx, payload: None)
    yield "test.vanishing"
    registry.unregister("test.vanishing")


def test_a_fire_that_enqueue_refuses_is_recorded_and_the_schedule_moves_on(
    make_schedule, vanishing_operation
):
    schedule = make_schedule(operation=vanishing_operation, every_seconds=60)
    slot = schedule.next_fire_at
    registry.unregister(vanishing_operation)
    result = fire_due_schedules(slot)
    assert (result.fired, result.failed) == (0, 1)
    assert fires(schedule) == [(slot, ENQUEUE_FAILED, None)]
    assert fresh(schedule).next_fire_at == slot + timedelta(minutes=1)


def test_deleting_a_schedule_keeps_its_jobs(make_schedule):
    schedule = make_schedule(every_seconds=60)
    fire_due_schedules(schedule.next_fire_at)
    [job] = assert_enqueued(schedule=schedule, count=1)
    delete_schedule(schedule.pk)
    job.refresh_from_db()
    assert job.schedule_id is None and job.status == "queued"
    refute_enqueued(schedule=schedule.pk)
    assert not ScheduleFire.objects.filter(schedule_id=schedule.pk).exists()


def test_old_fire_records_are_pruned(make_schedule):
    schedule = make_schedule(every_seconds=60, catch_up="all")
    first = schedule.next_fire_at
    fire_due_schedules(first + timedelta(minutes=4))
    assert prune_fires(first + timedelta(minutes=2), limit=1) == 1
    assert prune_fires(first + timedelta(minutes=2), limit=10) == 1
    assert [f[0] for f in fires(schedule)] == [first + timedelta(minutes=m) for m in (2, 3, 4)]


def test_a_cron_schedule_fires_in_its_time_zone(make_schedule):
    schedule = make_schedule(cron="30 9 * * *", timezone="America/New_York")
    slot = schedule.next_fire_at
    local = slot.astimezone(ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (9, 30)
    assert fire_due_schedules(slot).fired == 1
    assert fresh(schedule).next_fire_at - slot in (
        timedelta(hours=23),
        timedelta(hours=24),
        timedelta(hours=25),
    )
