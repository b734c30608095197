"""A crowd of due schedules and the firing budget.

Firing is time-boxed (``SCHEDULE_FIRE_BUDGET_SECONDS``), most overdue first:
a reaper pass with hundreds of due every-second schedules fires for its
budget, leaves the rest due, and still rescues an expired lease in the same
pass. Over repeated calls every due slot fires exactly once, the deferred
ones by their ``catch_up`` (``all``: each missed slot, none lost).

A budget of a microsecond fires exactly one slot per call (one always fires,
so firing makes progress): one schedule, or one slot of a ``catch_up = all``
schedule's backlog, which makes the deferral tests exact.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest

from jobs.claims import claim_jobs
from jobs.clock import db_now
from jobs.enqueue import enqueue
from jobs.models import Job, Schedule, ScheduleFire, Worker
from jobs.schedules.firing import FireTimer, fire_due_schedules
from jobs.schedules.services import create_schedule
from tests.factories import unique_queue
from workers.reaper import Reaper

TINY = 0.000001  # one slot per call


def whole_second(instant: datetime) -> datetime:
    return instant.replace(microsecond=0)


def slot_before(instant: datetime, every_seconds: int) -> datetime:
    """The last slot of an ``every_seconds`` schedule at or before ``instant`` (epoch-aligned)."""
    return instant - timedelta(seconds=instant.timestamp() % every_seconds)


def make_due(
    count: int, *, catch_up: str, every_seconds: int = 1
) -> tuple[list[Schedule], datetime]:
    """``count`` schedules (through the service), the i-th due ``i`` slots before ``base``."""
    queue = unique_queue()
    schedules = [
        create_schedule(
            {
                "name": f"crowd-{queue}-{i}",
                "operation": "ping",
                "every_seconds": every_seconds,
                "catch_up": catch_up,
                "queue": queue,
            }
        )
        for i in range(count)
    ]
    base = slot_before(db_now() - timedelta(seconds=2), every_seconds)
    for i, schedule in enumerate(schedules):
        schedule.next_fire_at = base - timedelta(seconds=i * every_seconds)
        Schedule.objects.filter(pk=schedule.pk).update(next_fire_at=schedule.next_fire_at)
    return schedules, base


def fired_per_schedule(schedules: list[Schedule]) -> Counter:
    ids = [s.pk for s in schedules]
    return Counter(
        ScheduleFire.objects.filter(schedule_id__in=ids).values_list("schedule_id", flat=True)
    )


@pytest.mark.django_db(transaction=True)
def test_a_pass_fires_for_its_budget_and_still_rescues_an_expired_lease(settings, caplog):
    budget, slack, count = 0.3, 1.5, 300
    settings.CONTROLPLANE = {"SCHEDULE_FIRE_BUDGET_SECONDS": budget}
    schedules, _ = make_due(count, catch_up="one")
    job = enqueue("ping", queue=unique_queue())
    worker_row = Worker.objects.create(name="crowd")
    [held] = claim_jobs(queues=[job.queue], worker_id=worker_row.pk, limit=1, lease_seconds=600)
    Job.objects.filter(pk=held.id).update(leased_until=db_now() - timedelta(seconds=1))
    reaper = Reaper()
    reaper._schedules_synced = True  # the code's schedules (none) are not this test's concern

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="workers"):
        result = reaper.run_once()
    took = time.monotonic() - started

    assert 0 < result.schedules_fired < count, result
    assert result.schedules_left == count - result.schedules_fired
    assert took < budget + slack, f"the pass took {took:.2f} s ({result})"
    # The other duties ran in the same pass.
    assert result.lease_requeued == 1
    assert Job.objects.get(pk=job.pk).status == "queued"
    assert f"reaper.schedules_cut_short where=pass left={result.schedules_left} " in caplog.text
    # Most overdue first: the ones fired are the oldest due.
    fired = fired_per_schedule(schedules)
    assert set(fired) == {s.pk for s in schedules[count - result.schedules_fired :]}
    assert set(fired.values()) == {1}
    # The rest are still due, untouched: the next wake-up fires them.
    still_due = Schedule.objects.filter(
        pk__in=[s.pk for s in schedules], next_fire_at__lte=db_now()
    )
    assert still_due.count() >= result.schedules_left


@pytest.mark.django_db
def test_deferred_slots_fire_exactly_once_across_passes_with_catch_up_all():
    # Twelve schedules, each overdue by another number of slots: a backlog that grows
    # while passes are cut short and drains most overdue first (one fire per call,
    # about 200 calls; 60 schedules took 2,400 calls and proved nothing more).
    count = 12
    schedules, base = make_due(count, catch_up="all")
    since = {s.pk: s.next_fire_at for s in schedules}
    # Passes 1.5 s apart, each cut short after one schedule: a growing backlog.
    now = base
    for _ in range(6):
        now += timedelta(milliseconds=1500)
        result = fire_due_schedules(now, budget=TINY)
        assert result.left > 0
    # Then passes at one instant until nothing is left: each fires the most overdue one.
    calls, slots = 0, count * (int((now - base).total_seconds()) + count)
    while True:
        calls += 1
        assert calls <= slots, "the backlog never drained"
        before = Schedule.objects.filter(pk__in=since, next_fire_at__lte=now)
        oldest = before.order_by("next_fire_at", "pk").first()
        result = fire_due_schedules(now, budget=TINY)
        if oldest is not None:
            assert ScheduleFire.objects.filter(schedule=oldest).exists()
        if not result.left:
            break
    assert not Schedule.objects.filter(pk__in=since, next_fire_at__lte=now).exists()
    # Every slot from each schedule's first due one to ``now``: once, none lost.
    rows = ScheduleFire.objects.filter(schedule_id__in=since).values_list(
        "schedule_id", "fire_at", "job_id"
    )
    got: dict = {}
    for schedule_id, fire_at, job_id in rows:
        assert job_id is not None
        got.setdefault(schedule_id, []).append(fire_at)
    for schedule_id, first in since.items():
        seconds = int((whole_second(now) - first).total_seconds())
        want = [first + timedelta(seconds=k) for k in range(seconds + 1)]
        assert sorted(got[schedule_id]) == want
    assert Job.objects.filter(schedule_id__in=since).count() == len(rows)


@pytest.mark.django_db
def test_the_timer_fires_for_its_budget_and_is_due_again_at_once(settings):
    count = 40
    settings.CONTROLPLANE = {"SCHEDULE_FIRE_BUDGET_SECONDS": TINY}
    schedules, _ = make_due(count, catch_up="one", every_seconds=3600)
    timer = FireTimer(poll_seconds=60)
    results = []
    while not results or results[-1].left:
        assert len(results) < count, "the timer never caught up"
        assert timer.seconds_until_due() == 0
        result = timer.fire_if_due()
        assert result is not None
        results.append(result)
    assert [r.fired for r in results] == [1] * count
    assert [r.left for r in results] == list(range(count - 1, -1, -1))
    assert set(fired_per_schedule(schedules).values()) == {1}
    assert len(fired_per_schedule(schedules)) == count
    # Nothing due now: the timer waits for the next slot (or its poll).
    assert timer.fire_if_due() is None


@pytest.mark.django_db
def test_a_long_catch_up_all_backlog_is_cut_between_slots_and_goes_on_from_the_first_left():
    [schedule], base = make_due(1, catch_up="all", every_seconds=60)
    now = base + timedelta(minutes=9, seconds=30)  # ten slots due: base .. base + 9 min
    result = fire_due_schedules(now, budget=TINY)
    assert (result.fired, result.left) == (1, 1)
    assert Schedule.objects.get(pk=schedule.pk).next_fire_at == base + timedelta(minutes=1)
    for fired in range(2, 11):
        result = fire_due_schedules(now, budget=TINY)
        assert result.fired == 1
        assert result.left == (0 if fired == 10 else 1)
    assert sorted(
        ScheduleFire.objects.filter(schedule=schedule).values_list("fire_at", flat=True)
    ) == [base + timedelta(minutes=m) for m in range(10)]
    assert Schedule.objects.get(pk=schedule.pk).next_fire_at == base + timedelta(minutes=10)
    assert Schedule.objects.get(pk=schedule.pk).last_fire_at == base + timedelta(minutes=9)
