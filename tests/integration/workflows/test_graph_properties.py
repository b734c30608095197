"""Random graphs, random failures, random policies: what must hold whatever the shape."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_controlplane.testing import drain_jobs
from jobs.dependencies import After
from jobs.models import Dependency, Job, JobEvent
from jobs.workflows import workflow

pytestmark = pytest.mark.django_db(transaction=True)

POLICIES = ("cancel", "run", "hold")


@st.composite
def graphs(draw):
    """Up to 10 steps; each may depend on earlier ones (a DAG) with a policy; some fail."""
    size = draw(st.integers(1, 10))
    steps = []
    for index in range(size):
        parents = draw(st.sets(st.integers(0, index - 1), max_size=3)) if index else set()
        steps.append(
            {
                "fails": draw(st.booleans()) and draw(st.booleans()),
                "after": sorted((p, draw(st.sampled_from(POLICIES))) for p in parents),
            }
        )
    return steps


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(graph=graphs())
def test_every_graph_runs_each_step_at_most_once_and_only_when_allowed(graph):
    flow = workflow("random")
    handles = []
    for index, step in enumerate(graph):
        handles.append(
            flow.step(
                "fail" if step["fails"] else "ping",
                {"message": "planned"} if step["fails"] else {},
                name=f"s{index}",
                depends_on=[After(handles[p], on_failure=policy) for p, policy in step["after"]],
            )
        )
    run = flow.enqueue()
    drain_jobs()
    jobs = {j.step: j for j in Job.objects.filter(workflow=run)}
    started = {
        e.job_id: e.ts for e in JobEvent.objects.filter(job__workflow=run, event="job.started")
    }
    starts_per_job = {}
    for e in JobEvent.objects.filter(job__workflow=run, event="job.started"):
        starts_per_job[e.job_id] = starts_per_job.get(e.job_id, 0) + 1
    assert all(n == 1 for n in starts_per_job.values())
    for index, step in enumerate(graph):
        job = jobs[f"s{index}"]
        ups = [(jobs[f"s{p}"], policy) for p, policy in step["after"]]
        if job.id in started:
            for up, policy in ups:
                # It ran only once each dependency had ended, and succeeded unless "run".
                assert up.status in ("succeeded", "failed", "cancelled")
                assert up.finished_at <= started[job.id]
                assert up.status == "succeeded" or policy == "run"
        elif job.status == "queued":
            # Still waiting: held by a failed dependency under "hold" (or one upstream of it).
            assert job.run_after is None and job.waiting_for > 0
            assert any(up.status != "succeeded" for up, _ in ups)
        else:
            assert job.status == "cancelled"
            assert any(up.status in ("failed", "cancelled") for up, _ in ups)
    unmet = Dependency.objects.filter(job__workflow=run, met=False).count()
    assert unmet == sum(j.waiting_for for j in jobs.values())  # counts match the edges
    run.refresh_from_db()
    if any(j.status == "queued" for j in jobs.values()):
        assert run.status in ("held", "running")
    else:
        finals = [j for j in jobs.values() if not j.has_dependents]
        expected = "succeeded" if all(j.status == "succeeded" for j in finals) else "failed"
        assert run.status == expected
