"""django_controlplane.testing's ``parent`` and ``schedule`` criteria: the children one job
enqueued, the jobs one schedule fired (a job or schedule, or its id), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from django_controlplane.testing import assert_enqueued, enqueued_jobs, refute_enqueued
from jobs.enqueue import enqueue
from jobs.schedules.firing import fire_due_schedules
from jobs.schedules.services import create_schedule, pause_schedule
from tests.factories import ECHO, unique_queue

pytestmark = pytest.mark.django_db


def test_parent_keeps_the_children_of_that_job_only():
    mine = enqueue("ping", queue=unique_queue())
    other = enqueue("ping", queue=unique_queue())
    first = enqueue(ECHO, {"n": 1}, parent=mine.pk)
    second = enqueue(ECHO, {"n": 2}, parent=mine.pk)
    theirs = enqueue(ECHO, {"n": 1}, parent=other.pk)

    assert [j.pk for j in assert_enqueued(parent=mine, count=2)] == [first.pk, second.pk]
    assert [j.pk for j in enqueued_jobs(ECHO, parent=str(mine.pk), payload={"n": 2})] == [second.pk]
    assert [j.pk for j in assert_enqueued(parent=other.pk, payload={"n": 1})] == [theirs.pk]
    refute_enqueued(parent=first)
    refute_enqueued("ping", parent=mine)


def test_schedule_keeps_the_jobs_that_schedule_fired():
    fired = create_schedule({"operation": "ping", "queue": unique_queue(), "every_seconds": 60})
    idle = create_schedule({"operation": "ping", "queue": unique_queue(), "every_seconds": 60})
    pause_schedule(idle.pk)
    enqueue("ping", queue=fired.queue)  # same operation and queue, fired by no schedule
    assert fire_due_schedules(fired.next_fire_at).fired == 1

    [job] = assert_enqueued("ping", schedule=fired, count=1)
    assert job.schedule_id == fired.pk and job.queue == fired.queue
    assert enqueued_jobs(schedule=str(fired.pk)) == [job]
    refute_enqueued(schedule=idle)


def test_a_failed_assertion_names_the_parent_and_schedule_it_looked_for():
    parent = enqueue("ping", queue=unique_queue())
    schedule = create_schedule({"operation": "ping", "queue": unique_queue(), "every_seconds": 60})

    with pytest.raises(AssertionError) as missing:
        assert_enqueued("ping", parent=parent)
    assert f"with operation='ping', parent={parent.pk!r}; found 0" in str(missing.value)
    assert "Enqueued jobs (1)" in str(missing.value)

    with pytest.raises(AssertionError) as none_fired:
        assert_enqueued(schedule=schedule.pk, count=1)
    assert f"exactly 1 job(s) with schedule={schedule.pk!r}; found 0" in str(none_fired.value)

    child = enqueue("ping", parent=parent.pk)
    with pytest.raises(AssertionError) as present:
        refute_enqueued(parent=parent.pk)
    assert f"Expected no job with parent={parent.pk!r}; found 1" in str(present.value)
    assert str(child.payload) in str(present.value)
