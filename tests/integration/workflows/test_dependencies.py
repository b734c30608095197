"""Dependencies between jobs and workflows, run in the test (``drain_jobs``), both databases."""

from __future__ import annotations

import uuid

import pytest

from django_controlplane.testing import drain_jobs
from jobs.dependencies import After, dependency_rows
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.exceptions import EnqueueError
from jobs.models import Job, JobEvent, Workflow
from jobs.operations import operation
from jobs.transitions import cancel_job, retry_job
from jobs.workflows import cancel_workflow, step_counts, workflow

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "wf_tests.add"
BOOM = "wf_tests.boom"
SEEN: list[str] = []


@operation(ADD, payload_schema={"type": "object"})
def add(ctx, payload):
    """Its own number plus the sum of its dependencies' results."""
    SEEN.append(payload.get("n"))
    return payload.get("n", 0) + sum(ctx.dependency_results().values())


@operation(BOOM, payload_schema={"type": "object"})
def boom(ctx, payload):
    raise RuntimeError("boom")


@pytest.fixture(autouse=True)
def _seen():
    SEEN.clear()


def _status(job) -> str:
    return Job.objects.get(pk=job.pk).status


def test_a_job_waits_for_its_dependencies_and_reads_their_results():
    a = enqueue(ADD, {"n": 1})
    b = enqueue(ADD, {"n": 2})
    c = enqueue(ADD, {"n": 10}, depends_on=[a.id, str(b.id)])
    assert c.run_after is None and c.waiting_for == 2 and c.status == "queued"
    drain_jobs()
    assert SEEN == [1, 2, 10]
    c.refresh_from_db()
    assert c.status == "succeeded" and c.result == 13
    assert {r["met"] for r in dependency_rows(c.id)} == {True}


def test_a_dependency_already_succeeded_counts_as_met():
    a = enqueue(ADD, {"n": 1})
    drain_jobs()
    c = enqueue(ADD, {"n": 5}, depends_on=[a])
    assert c.run_after is not None and c.waiting_for == 0
    drain_jobs()
    assert _status(c) == "succeeded"


def test_failure_cancels_downstream_with_the_reason_and_retry_resumes():
    a = enqueue(BOOM, {})
    b = enqueue(ADD, {"n": 1}, depends_on=[a])
    c = enqueue(ADD, {"n": 2}, depends_on=[b])
    drain_jobs()
    assert [_status(j) for j in (a, b, c)] == ["failed", "cancelled", "cancelled"]
    event = JobEvent.objects.filter(job=b, event="job.cancelled").get()
    assert event.fields["dependency"] == str(a.id) and "did not succeed" in event.message
    # The operator retries the failed job: its downstream waits for it again.
    retry_job(a.id, by="op")
    assert [_status(j) for j in (a, b, c)] == ["queued", "queued", "queued"]
    assert Job.objects.get(pk=b.pk).run_after is None


def test_run_anyway_and_hold_policies():
    a = enqueue(BOOM, {})
    runs = enqueue(ADD, {"n": 3}, depends_on=[After(a, on_failure="run")])
    held = enqueue(ADD, {"n": 4}, depends_on=[a], on_failure="hold")
    drain_jobs()
    assert _status(runs) == "succeeded"
    held.refresh_from_db()
    assert held.status == "queued" and held.run_after is None and held.waiting_for == 1


def test_cycles_and_bad_references_are_refused_and_nothing_is_stored():
    before = Job.objects.count()
    with pytest.raises(EnqueueError) as cycle:
        enqueue_many(
            [
                JobSpec(ADD, {"n": 1}, depends_on=[2]),
                JobSpec(ADD, {"n": 2}, depends_on=[0]),
                JobSpec(ADD, {"n": 3}, depends_on=[1]),
            ]
        )
    assert "cycle" in str(cycle.value.errors)
    with pytest.raises(EnqueueError) as missing:
        enqueue(ADD, {}, depends_on=[uuid.uuid4()])
    assert "depends_on" in missing.value.errors
    with pytest.raises(EnqueueError) as policy:
        enqueue(ADD, {}, depends_on=[uuid.uuid4()], on_failure="explode")
    assert "on_failure" in policy.value.errors
    with pytest.raises(EnqueueError):
        enqueue(ADD, {}, depends_on="not-a-list")
    assert Job.objects.count() == before


def test_a_workflow_runs_in_order_settles_and_has_a_result():
    flow = workflow("sum")
    a = flow.step(ADD, {"n": 1}, name="a")
    b = flow.step(ADD, {"n": 2}, name="b")
    flow.step(ADD, {"n": 100}, name="total", depends_on=[a, b])
    run = flow.enqueue()
    assert step_counts(run.id)["queued"] == 3
    drain_jobs()
    run.refresh_from_db()
    assert run.status == "succeeded" and run.result == 103 and run.finished_at is not None
    total = Job.objects.get(workflow=run, step="total")
    assert total.result == 103


def test_a_workflow_refuses_a_cycle_by_name():
    flow = workflow("loop")
    flow.step(ADD, {}, name="a", depends_on=["b"])
    flow.step(ADD, {}, name="b", depends_on=["a"])
    with pytest.raises(EnqueueError):
        flow.enqueue()
    assert not Workflow.objects.filter(name="loop").exists()


def test_a_failed_workflow_and_a_held_one():
    flow = workflow("fails")
    bad = flow.step(BOOM, {}, name="bad")
    flow.step(ADD, {"n": 1}, name="after", depends_on=[bad])
    run = flow.enqueue()
    drain_jobs()
    run.refresh_from_db()
    assert run.status == "failed"
    assert step_counts(run.id) == {
        "queued": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 1,
        "cancelled": 1,
    }
    held = workflow("held", on_failure="hold")
    bad = held.step(BOOM, {}, name="bad")
    held.step(ADD, {"n": 1}, name="after", depends_on=[bad])
    run = held.enqueue()
    drain_jobs()
    run.refresh_from_db()
    assert run.status == "held"
    # Retrying the failed step resumes the workflow from there.
    retry_job(Job.objects.get(workflow=run, step="bad").id)
    run.refresh_from_db()
    assert run.status == "running"


def test_cancelling_a_workflow_cancels_its_steps_with_the_reason():
    flow = workflow("stop me")
    a = flow.step(ADD, {"n": 1}, name="a")
    flow.step(ADD, {"n": 2}, name="b", depends_on=[a])
    run = flow.enqueue()
    assert cancel_workflow(run.id, by="op", reason="not today") == 2
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert set(Job.objects.filter(workflow=run).values_list("status", flat=True)) == {"cancelled"}
    assert cancel_workflow(run.id) == 0


def test_cancelling_a_dependency_cancels_what_waits_for_it():
    a = enqueue(ADD, {"n": 1})
    b = enqueue(ADD, {"n": 2}, depends_on=[a])
    cancel_job(a.id, by="op")
    assert _status(b) == "cancelled"


def test_a_workflow_from_json_runs_and_bad_json_names_the_field():
    from jobs.workflow_specs import start_workflow

    run = start_workflow(
        {
            "name": "json",
            "steps": [
                {"name": "a", "operation": ADD, "payload": {"n": 1}},
                {"name": "b", "operation": ADD, "payload": {"n": 2}, "depends_on": ["a"]},
            ],
        }
    )
    drain_jobs()
    run.refresh_from_db()
    assert run.status == "succeeded" and run.result == 3
    with pytest.raises(EnqueueError) as bad:
        start_workflow({"steps": [{"operation": ADD, "payload": [1]}, {"operation": "nope"}]})
    assert set(bad.value.errors) >= {"steps.0.payload", "steps.1.operation"}
    with pytest.raises(EnqueueError) as unknown:
        start_workflow({"steps": [{"operation": ADD, "depends_on": ["ghost"]}], "extra": 1})
    assert "extra" in unknown.value.errors


def test_a_workflow_on_a_failed_job_is_cancelled_through_and_settles():
    failed = enqueue(BOOM, {})
    drain_jobs()
    flow = workflow("late")
    first = flow.step(ADD, {"n": 1}, name="first", depends_on=[failed.id])
    flow.step(ADD, {"n": 2}, name="second", depends_on=[first])
    run = flow.enqueue()
    run.refresh_from_db()
    assert run.status == "failed"
    assert set(Job.objects.filter(workflow=run).values_list("status", flat=True)) == {"cancelled"}


def test_a_finished_workflow_goes_once_retention_took_its_steps():
    from datetime import timedelta

    from jobs.clock import db_now
    from jobs.workflows import prune_finished_workflows

    flow = workflow("old")
    flow.step(ADD, {"n": 1})
    run = flow.enqueue()
    drain_jobs()
    later = db_now() + timedelta(days=1)
    assert prune_finished_workflows(later, 100) == 0  # its step is still kept
    Job.objects.filter(workflow=run).delete()
    assert prune_finished_workflows(later, 100) == 1
    assert not Workflow.objects.filter(pk=run.pk).exists()


def test_step_names_are_stored_as_given_or_refused():
    flow = workflow("names")
    odd = 'quote " back \\ comma, {brace}'
    first = flow.step(ADD, {"n": 1}, name=odd)
    flow.step(ADD, {"n": 2}, name="<b>x</b>", depends_on=[first])
    run = flow.enqueue()
    assert set(Job.objects.filter(workflow=run).values_list("step", flat=True)) == {
        odd,
        "<b>x</b>",
    }
    with pytest.raises(EnqueueError):
        workflow("bad").step(ADD, {}, name="nul\x00")


def test_a_json_workflow_names_the_step_whose_dependency_is_unknown():
    from jobs.workflow_specs import start_workflow

    with pytest.raises(EnqueueError) as unknown:
        start_workflow(
            {
                "steps": [
                    {"name": "a", "operation": ADD},
                    {"name": "b", "operation": ADD, "depends_on": ["a", "ghost"]},
                ]
            }
        )
    assert unknown.value.errors == {"steps.1.depends_on": ["No step is named 'ghost'."]}


def test_run_now_refuses_a_job_waiting_for_its_dependencies():
    from jobs.rescheduling import NotWaiting, run_job_now

    a = enqueue(ADD, {"n": 1})
    b = enqueue(ADD, {"n": 2}, depends_on=[a])
    with pytest.raises(NotWaiting, match="dependencies"):
        run_job_now(b.id, by="op")
    assert Job.objects.get(pk=b.pk).run_after is None
