"""Workflows under real workers: a fan-in raced by four ``runworker`` processes, two of them
killed with SIGKILL mid-run and their jobs rescued by a reaper, and a chain run by two.

Judged from the jobs' events alone (``job.started`` / ``job.succeeded`` and their ``ts``),
on PostgreSQL and SQLite (one machine, the same semantics).
"""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from jobs import events
from jobs.models import Job, JobEvent, Worker, Workflow
from jobs.workflows import step_counts, workflow
from tests.conftest import wait_for
from tests.integration.flow_keys.conftest import runs_of

pytestmark = pytest.mark.django_db(transaction=True)

FAN_IN = 300
CHAIN = 50
# A dependency sleeps a little, so that killed workers hold some of them running.
STEP_NAP = {"seconds": 0.03}


@pytest.fixture
def worker(start_process) -> Callable[..., Any]:
    """Start ``runworker`` on one queue with ``--concurrency`` slots."""

    def start(queue: str, concurrency: int = 4) -> Any:
        return start_process("runworker", "--queue", queue, "--concurrency", str(concurrency))

    return start


def succeeded_in(workflow_id: uuid.UUID) -> int:
    return JobEvent.objects.filter(event=events.JOB_SUCCEEDED, job__workflow_id=workflow_id).count()


def busiest_worker_pid(workflow_id: uuid.UUID, alive: set[int]) -> int | None:
    """The pid of the live worker holding the most of the workflow's running steps now."""
    running = Counter(
        Job.objects.filter(workflow_id=workflow_id, status="running").values_list(
            "worker_id", flat=True
        )
    )
    pids = dict(Worker.objects.filter(pk__in=list(running)).values_list("pk", "pid"))
    for worker_id, _ in running.most_common():
        if pids.get(worker_id) in alive:
            return pids[worker_id]
    return None


def event_times(job_ids: list[Any], event: str) -> dict[Any, list[Any]]:
    """The ``ts`` of each job's ``event`` events, in ``seq`` order."""
    times: dict[Any, list[Any]] = {job_id: [] for job_id in job_ids}
    rows = (
        JobEvent.objects.filter(job_id__in=job_ids, event=event)
        .order_by("job_id", "seq")
        .values_list("job_id", "ts")
    )
    for job_id, ts in rows:
        times[job_id].append(ts)
    return times


def workflow_ended(workflow_id: uuid.UUID) -> str | None:
    status = Workflow.objects.get(pk=workflow_id).status
    return status if status not in ("running", "held") else None


def test_a_fan_in_starts_its_final_step_once_after_every_dependency_through_kill_9(
    worker, start_process
):
    """300 steps into one final step, four workers of 4 slots racing to end the last
    dependencies, two of them killed with SIGKILL mid-run (their steps rescued by the
    reaper when their leases lapse): every step succeeds exactly once, and the final step
    starts exactly once, after the last dependency's success."""
    queue = f"wf-fanin-{uuid.uuid4().hex[:6]}"
    flow = workflow("fan-in under kill -9")
    deps = [flow.step("sleep", STEP_NAP, name=f"dep-{n}", queue=queue) for n in range(FAN_IN)]
    flow.step("ping", name="final", depends_on=deps, queue=queue)
    run = flow.enqueue()
    ids = dict(Job.objects.filter(workflow_id=run.id).values_list("step", "pk"))
    final_id = ids.pop("final")
    dep_ids = list(ids.values())
    assert len(dep_ids) == FAN_IN

    procs = [worker(queue) for _ in range(4)]
    reaper = start_process("reaper", "--interval", "0.2")
    victims = []
    for threshold in (FAN_IN // 5, FAN_IN // 2):
        wait_for(
            lambda t=threshold: succeeded_in(run.id) >= t,
            timeout=30,
            interval=0.01,
            message=f"{threshold} steps succeeded",
        )
        alive = {p.pid for p in procs if p.popen.poll() is None}
        pid = wait_for(
            lambda a=alive: busiest_worker_pid(run.id, a),
            timeout=10,
            interval=0.01,
            message="a live worker running steps",
        )
        victim = next(p for p in procs if p.pid == pid)
        victim.signal(signal.SIGKILL)
        victim.popen.wait(timeout=10)
        victims.append(victim)
    status = wait_for(lambda: workflow_ended(run.id), timeout=40, message="the workflow's end")
    for proc in procs:
        assert proc in victims or proc.popen.poll() is None, proc.output()

    assert status == "succeeded", step_counts(run.id)
    assert step_counts(run.id)["succeeded"] == FAN_IN + 1
    everything = [*dep_ids, final_id]
    succeeded = event_times(everything, events.JOB_SUCCEEDED)
    assert {len(times) for times in succeeded.values()} == {1}  # none lost, none twice
    runs = runs_of(everything)  # also checks no job started twice without an end between
    rescued = [r for r in runs if r.end_event == events.JOB_LEASE_EXPIRED_REQUEUE]
    assert rescued, "the killed workers' steps were rescued by the reaper"
    assert len(runs) == len(everything) + len(rescued)  # a second run only after a rescue
    assert final_id not in {r.job_id for r in rescued}

    final_starts = event_times([final_id], events.JOB_STARTED)[final_id]
    assert len(final_starts) == 1, final_starts  # exactly once
    last_dependency = max(succeeded[job_id][0] for job_id in dep_ids)
    gap = (final_starts[0] - last_dependency).total_seconds()
    print(
        f"final step started {gap * 1000:.0f} ms after the last dependency's success; "
        f"{len(rescued)} steps rescued from {len(victims)} killed workers"
    )
    assert gap >= 0, gap  # after every dependency's success
    assert gap < 2.0, gap  # released by that success, not by a poll long after
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0, reaper.output()


def test_a_chain_runs_its_steps_in_order_on_two_workers(worker):
    """50 steps each waiting for the one before, two workers: each starts after the one
    before it succeeded, each once, and the workflow's result is the last step's."""
    queue = f"wf-chain-{uuid.uuid4().hex[:6]}"
    flow = workflow("chain")
    previous = None
    for n in range(CHAIN):
        previous = flow.step(
            "ping", name=f"step-{n:03}", depends_on=[previous] if previous else [], queue=queue
        )
    run = flow.enqueue()
    order = [
        pk for _, pk in sorted(Job.objects.filter(workflow_id=run.id).values_list("step", "pk"))
    ]
    for _ in range(2):
        worker(queue)
    status = wait_for(lambda: workflow_ended(run.id), timeout=40, message="the chain's end")

    assert status == "succeeded", step_counts(run.id)
    started = event_times(order, events.JOB_STARTED)
    succeeded = event_times(order, events.JOB_SUCCEEDED)
    assert all(len(started[j]) == 1 and len(succeeded[j]) == 1 for j in order)
    gaps = [
        (started[later][0] - succeeded[earlier][0]).total_seconds()
        for earlier, later in zip(order, order[1:], strict=False)
    ]
    assert min(gaps) >= 0, gaps  # in order: no step before the one it waits for
    gaps.sort()
    print(
        f"chain of {CHAIN}: step-to-step p50 {gaps[len(gaps) // 2] * 1000:.1f} ms, "
        f"max {gaps[-1] * 1000:.1f} ms"
    )
    assert Workflow.objects.get(pk=run.id).result == {"pong": True}
