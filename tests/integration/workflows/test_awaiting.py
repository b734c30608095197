"""Waiting for a job or a workflow from Python: LISTEN on PostgreSQL, polling on SQLite."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_controlplane.testing import drain_jobs
from jobs.enqueue import enqueue
from jobs.workflows import workflow

pytestmark = pytest.mark.django_db(transaction=True)


def _drain_later(delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        try:
            drain_jobs()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_job_wait_returns_when_it_ends_not_at_the_timeout():
    job = enqueue("ping")
    thread = _drain_later(0.3)
    started = time.monotonic()
    done = job.wait(timeout=20)
    waited = time.monotonic() - started
    thread.join(10)
    assert done.status == "succeeded" and done.result == {"pong": True}
    assert waited < 10  # woken by the end, far from the 20 s timeout


def test_a_wait_that_times_out_returns_the_job_as_it_is():
    job = enqueue("ping", queue="nobody-serves-this")
    started = time.monotonic()
    same = job.wait(timeout=0.3)
    assert same.status == "queued"
    assert 0.25 <= time.monotonic() - started < 5


def test_a_workflow_wait_returns_its_result():
    flow = workflow("waited")
    first = flow.step("ping", name="first")
    flow.step("ping", name="second", depends_on=[first])
    run = flow.enqueue()
    thread = _drain_later(0.2)
    done = run.wait(timeout=20)
    thread.join(10)
    assert done.status == "succeeded" and done.result == {"pong": True}
