"""Schedules that fire a workflow: once per slot, catch-up and overlap as for jobs, run now,
a workflow refused by field when the schedule is saved, and nothing left by a refused fire.

Time is driven by the ``now`` given to ``fire_due_schedules``, as in test_firing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_controlplane.testing import drain_jobs
from jobs import audit
from jobs.models import Job, OperatorAction, Schedule, ScheduleFire, Workflow
from jobs.operations import operation, registry
from jobs.schedules.definitions import ScheduleInvalid
from jobs.schedules.firing import ENQUEUE_FAILED, claim_slot, fire_due_schedules
from jobs.schedules.selectors import last_outcome, schedule_get, schedule_history
from jobs.schedules.services import create_schedule, run_schedule_now, update_schedule
from tests.factories import unique_queue

from .conftest import fires

pytestmark = pytest.mark.django_db


def nightly(queue: str | None = None, **top: Any) -> dict[str, Any]:
    """Two ``ping`` steps, the second after the first, on a queue of their own."""
    queue = queue or unique_queue()
    return {
        "name": "nightly",
        "steps": [
            {"name": "first", "operation": "ping", "queue": queue},
            {"name": "second", "operation": "ping", "queue": queue, "depends_on": ["first"]},
        ],
        **top,
    }


def workflow_schedule(spec: dict[str, Any] | None = None, **values: Any) -> Schedule:
    values.setdefault("every_seconds", 60)
    return create_schedule({"workflow": spec or nightly(), **values})


def runs(schedule: Schedule) -> list[Workflow]:
    return list(Workflow.objects.filter(schedule=schedule).order_by("created_at"))


def fire_workflows(schedule: Schedule) -> list[Any]:
    return list(
        ScheduleFire.objects.filter(schedule=schedule)
        .order_by("fire_at")
        .values_list("workflow_id", flat=True)
    )


def test_each_slot_starts_one_workflow_that_names_its_schedule():
    schedule = workflow_schedule()
    assert schedule.operation == "" and schedule.workflow["name"] == "nightly"
    assert schedule.name.startswith("nightly-")
    slot = schedule.next_fire_at
    assert fire_due_schedules(slot - timedelta(microseconds=1)).fired == 0
    assert fire_due_schedules(slot).fired == 1
    [run] = runs(schedule)
    assert (run.name, run.status) == ("nightly", "running")
    steps = Job.objects.filter(workflow=run).order_by("step")
    assert [(j.step, j.operation, j.schedule_id) for j in steps] == [
        ("first", "ping", None),
        ("second", "ping", None),
    ]
    assert fires(schedule) == [(slot, "enqueued", None)]
    assert fire_workflows(schedule) == [run.pk]
    # The same instant again, and a slot another reaper claimed: nothing more.
    assert fire_due_schedules(slot).fired == 0
    claim_slot(schedule.pk, slot + timedelta(minutes=1), timezone.now(), "enqueued")
    assert fire_due_schedules(slot + timedelta(minutes=1)).fired == 0
    assert len(runs(schedule)) == 1
    assert fire_due_schedules(slot + timedelta(minutes=2)).fired == 1
    assert len(runs(schedule)) == 2
    assert Job.objects.filter(workflow__schedule=schedule).count() == 4


def test_the_listing_and_history_show_the_workflow_and_its_status():
    schedule = workflow_schedule()
    fire_due_schedules(schedule.next_fire_at)
    [run] = runs(schedule)
    shown = schedule_get(schedule.pk)
    assert (shown.last_workflow, shown.last_job, last_outcome(shown)) == (run.pk, None, "running")
    [row] = schedule_history(schedule.pk)
    assert (row.job, row.workflow, row.workflow_status) == (None, run.pk, "running")
    drain_jobs(queues=[schedule.workflow["steps"][0]["queue"]])
    assert last_outcome(schedule_get(schedule.pk)) == "succeeded"


def test_catch_up_one_starts_one_workflow_for_every_missed_slot():
    schedule = workflow_schedule()
    first = schedule.next_fire_at
    assert fire_due_schedules(first + timedelta(minutes=30, seconds=10)).fired == 1
    assert len(runs(schedule)) == 1
    assert [f[0] for f in fires(schedule)] == [first + timedelta(minutes=30)]


def test_catch_up_all_starts_one_workflow_per_missed_slot(settings):
    settings.CONTROLPLANE = {"SCHEDULE_CATCH_UP_MAX": 3}
    schedule = workflow_schedule(catch_up="all")
    first = schedule.next_fire_at
    assert fire_due_schedules(first + timedelta(minutes=10)).fired == 3
    assert len(runs(schedule)) == 3
    assert all(fire_workflows(schedule))


def test_overlap_skip_waits_for_the_previous_workflow_to_end():
    queue = unique_queue()
    schedule = workflow_schedule(nightly(queue), overlap="skip")
    first = schedule.next_fire_at
    assert fire_due_schedules(first).fired == 1
    # Its first step done, the second not yet: the workflow is still running.
    drain_jobs(queues=[queue], limit=1)
    [run] = runs(schedule)
    assert Workflow.objects.get(pk=run.pk).status == "running"
    result = fire_due_schedules(first + timedelta(minutes=1))
    assert (result.fired, result.skipped_overlap) == (0, 1)
    assert fires(schedule)[1] == (first + timedelta(minutes=1), "skipped_overlap", None)
    drain_jobs(queues=[queue])
    assert Workflow.objects.get(pk=run.pk).status == "succeeded"
    assert fire_due_schedules(first + timedelta(minutes=2)).fired == 1
    assert len(runs(schedule)) == 2


@pytest.fixture
def failing_operation():
    operation("test.wf_sched_fails")(lambda ctx, payload: 1 / 0)
    yield "test.wf_sched_fails"
    registry.unregister("test.wf_sched_fails")


def test_overlap_skip_counts_a_workflow_held_for_an_operator_as_not_over(failing_operation):
    queue = unique_queue()
    spec = {
        "on_failure": "hold",
        "steps": [
            {"name": "a", "operation": failing_operation, "queue": queue, "max_attempts": 1},
            {"name": "b", "operation": "ping", "queue": queue, "depends_on": ["a"]},
        ],
    }
    schedule = workflow_schedule(spec, overlap="skip")
    first = schedule.next_fire_at
    fire_due_schedules(first)
    drain_jobs(queues=[queue])
    assert runs(schedule)[0].status == "held"
    assert fire_due_schedules(first + timedelta(minutes=1)).skipped_overlap == 1


def test_overlap_allow_starts_a_workflow_while_the_previous_runs():
    schedule = workflow_schedule()
    first = schedule.next_fire_at
    fire_due_schedules(first)
    assert fire_due_schedules(first + timedelta(minutes=1)).fired == 1
    assert [r.status for r in runs(schedule)] == ["running", "running"]


@pytest.fixture
def vanishing_operation():
    operation("test.wf_sched_vanishing")(lambda ctx, payload: None)
    yield "test.wf_sched_vanishing"
    registry.unregister("test.wf_sched_vanishing")


def test_a_fire_that_start_workflow_refuses_leaves_no_workflow_and_moves_on(vanishing_operation):
    spec = nightly()
    spec["steps"][1]["operation"] = vanishing_operation
    schedule = workflow_schedule(spec)
    slot = schedule.next_fire_at
    registry.unregister(vanishing_operation)
    result = fire_due_schedules(slot)
    assert (result.fired, result.failed) == (0, 1)
    assert fires(schedule) == [(slot, ENQUEUE_FAILED, None)]
    assert fire_workflows(schedule) == [None]
    assert runs(schedule) == [] and not Job.objects.filter(operation="ping").exists()
    assert Schedule.objects.get(pk=schedule.pk).next_fire_at == slot + timedelta(minutes=1)


def test_run_now_starts_the_workflow_and_records_it():
    schedule = create_schedule({"workflow": nightly(), "every_seconds": 60}, paused=True)
    run = run_schedule_now(schedule.pk, by=None, reason="try it")
    assert isinstance(run, Workflow) and run.schedule_id == schedule.pk
    [fire] = ScheduleFire.objects.filter(schedule=schedule)
    assert (fire.outcome, fire.workflow_id, fire.job_id) == ("run_now", run.pk, None)
    action = OperatorAction.objects.filter(action=audit.SCHEDULE_RUN).get()
    assert action.filter == {"schedule": str(schedule.pk), "workflow": str(run.pk)}
    create = OperatorAction.objects.filter(action=audit.SCHEDULE_CREATE).get()
    assert create.filter["workflow"] == "nightly"


def test_a_workflow_schedule_may_change_its_steps():
    schedule = workflow_schedule()
    changed = nightly()
    changed["steps"].append({"name": "third", "operation": "ping", "depends_on": ["second"]})
    update_schedule(schedule.pk, {"workflow": changed})
    fire_due_schedules(Schedule.objects.get(pk=schedule.pk).next_fire_at)
    [run] = runs(schedule)
    assert Job.objects.filter(workflow=run).count() == 3


def refused(values: dict[str, Any], **kwargs: Any) -> dict[str, list[str]]:
    with pytest.raises(ScheduleInvalid) as info:
        create_schedule({"every_seconds": 60, **values}, **kwargs)
    assert not Schedule.objects.exists()
    return info.value.errors


@pytest.mark.parametrize(
    ("steps", "field", "words"),
    [
        ([{"operation": "no.such.op"}], "workflow.steps.0.operation", "no.such.op"),
        ([{"operation": "ping", "payload": {"x": 1}}], "workflow.steps.0.payload", ""),
        (
            [{"name": "a", "operation": "ping"}, {"operation": "ping", "depends_on": ["zz"]}],
            "workflow.steps.1.depends_on",
            "No step is named 'zz'",
        ),
        (
            [
                {"name": "a", "operation": "ping", "depends_on": ["b"]},
                {"name": "b", "operation": "ping", "depends_on": ["a"]},
            ],
            "workflow.steps.0.depends_on",
            "cycle",
        ),
        ([{"operation": "ping", "priority": 500}], "workflow.steps.0.priority", "Priority"),
        ([{"operation": "ping", "colour": "red"}], "workflow.steps.0.colour", "Unknown"),
        ([], "workflow.steps", "non-empty"),
    ],
)
def test_a_bad_workflow_is_refused_by_field(steps, field, words):
    errors = refused({"workflow": {"steps": steps}})
    assert field in errors, errors
    assert words in " ".join(errors[field])


def test_a_schedule_has_exactly_one_of_operation_and_workflow():
    assert "workflow" in refused({"operation": "ping", "workflow": nightly()})
    assert "operation" in refused({})
    assert refused({"workflow": "steps"}) == {
        "workflow": ["The workflow must be a JSON object with its steps."]
    }
    errors = refused({"workflow": nightly(), "payload": {"a": 1}, "queue": "q", "priority": 3})
    assert set(errors) == {"payload", "queue", "priority"}


def test_a_job_schedule_does_not_become_a_workflow_schedule_nor_the_reverse():
    job_schedule = create_schedule({"operation": "ping", "every_seconds": 60})
    with pytest.raises(ScheduleInvalid) as info:
        update_schedule(job_schedule.pk, {"workflow": nightly()})
    assert "create a new schedule" in info.value.errors["workflow"][0]
    schedule = workflow_schedule()
    with pytest.raises(ScheduleInvalid) as info:
        update_schedule(schedule.pk, {"workflow": None})
    assert "workflow" in info.value.errors
    with pytest.raises(ScheduleInvalid) as info:
        update_schedule(schedule.pk, {"operation": "ping"})
    assert "operation" in info.value.errors


def test_a_deleted_workflow_leaves_its_fire_record_without_it():
    schedule = workflow_schedule()
    slot = schedule.next_fire_at
    fire_due_schedules(slot)
    [run] = runs(schedule)
    Job.objects.filter(workflow=run).delete()
    Workflow.objects.filter(pk=run.pk).delete()
    assert fires(schedule) == [(slot, "enqueued", None)]
    assert fire_workflows(schedule) == [None]
    assert last_outcome(schedule_get(schedule.pk)) == "enqueued"
