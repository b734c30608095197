"""The per-process registry behind ``?wait=S`` (``django_controlplane.api.waiters``), in process:
a thousand parked waits woken by one end, one query per check, jobs and workflows apart."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from django_controlplane.api.waiters import JOB, WORKFLOW, EndWaiters, ended_among
from jobs.enqueue import enqueue
from jobs.transitions import cancel_job
from jobs.workflow_specs import start_workflow
from jobs.workflows import cancel_workflow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _stop_listening() -> Iterator[None]:
    yield
    from django_controlplane.web.listener import listener

    listener.stop()  # before the test database is dropped


def test_ended_among_tells_jobs_and_workflows_apart():
    ended_job, open_job = enqueue("ping", {}), enqueue("ping", {})
    cancel_job(ended_job.pk, reason="t")
    ended_run = start_workflow({"steps": [{"operation": "ping"}]})
    open_run = start_workflow({"steps": [{"operation": "ping"}]})
    cancel_workflow(ended_run.pk)
    found = ended_among([ended_job.pk, open_job.pk], [ended_run.pk, open_run.pk])
    assert found == {(JOB, ended_job.pk), (WORKFLOW, ended_run.pk)}
    assert ended_among([], []) == set()


WAIT = 4.0  # seconds: the end comes after 1 s, the others run out at WAIT


def test_a_thousand_parked_waits_wake_together_at_one_query_per_check():
    waiters = EndWaiters()
    target = enqueue("ping", {})
    others = [enqueue("ping", {}).pk for _ in range(20)]
    ended_at: list[float] = []

    def end_soon() -> None:
        time.sleep(1.0)
        ended_at.append(time.monotonic())
        try:
            cancel_job(target.pk, reason="t")
        finally:
            connection.close()

    async def park() -> list[tuple[bool, float]]:
        async def one(job_id) -> tuple[bool, float]:
            woken = await waiters.wait(JOB, job_id, WAIT)
            return woken, time.monotonic()

        tasks = [one(target.pk) for _ in range(1000)] + [one(pk) for pk in others]
        threading.Thread(target=end_soon, daemon=True).start()
        return await asyncio.gather(*tasks)

    started = time.monotonic()
    results = asyncio.run(park())
    woken = results[:1000]
    assert all(ok for ok, _ in woken)
    lag = max(at for _, at in woken) - ended_at[0]
    # NOTIFY on PostgreSQL; the <= 0.5 s poll on SQLite.
    assert lag < 2.0, lag
    # The other twenty never ended: they ran out of their wait.
    assert not any(ok for ok, _ in results[1000:])
    assert time.monotonic() - started >= WAIT - 0.5
    # One query per check for all 1,020 waits, never one per wait.
    assert waiters.stats.checks < 60, waiters.stats.checks
    assert waiters.parked() == 0
