"""Two real ``manage.py reaper`` processes fire a workflow schedule: one workflow per slot."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest

from jobs.models import Job, ScheduleFire, Workflow
from jobs.schedules.services import create_schedule
from tests.conftest import wait_for
from tests.factories import unique_queue

pytestmark = pytest.mark.django_db(transaction=True)

SLOTS = 6


def test_two_reapers_start_one_workflow_per_slot_of_an_every_second_schedule(start_process):
    queue = unique_queue()
    schedule = create_schedule(
        {
            "workflow": {
                "name": "every second",
                "steps": [
                    {"name": "a", "operation": "ping", "queue": queue},
                    {"name": "b", "operation": "ping", "queue": queue, "depends_on": ["a"]},
                ],
            },
            "every_seconds": 1,
            "catch_up": "all",
        }
    )
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
    rows = list(
        ScheduleFire.objects.filter(schedule=schedule)
        .order_by("fire_at")
        .values_list("fire_at", "outcome", "workflow_id", "job_id")
    )
    slots = [row[0] for row in rows]
    assert slots == [slots[0] + timedelta(seconds=i) for i in range(len(slots))]
    assert all(outcome == "enqueued" and wf and job is None for _, outcome, wf, job in rows), rows
    runs = Workflow.objects.filter(schedule=schedule)
    assert sorted(str(r.pk) for r in runs) == sorted(str(row[2]) for row in rows)
    assert Job.objects.filter(workflow__schedule=schedule).count() == 2 * len(rows)
