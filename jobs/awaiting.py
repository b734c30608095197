"""Waiting, from Python, for a job or a workflow to end.

``wait_for_job(job_id, timeout)`` returns the job once it is ``succeeded``,
``failed`` or ``cancelled`` (or as it is when ``timeout`` runs out), and
``wait_for_workflow`` the same for a workflow. On PostgreSQL they LISTEN on
the channel every event insert notifies (``controlplane_events``, jobs
migration 0002) on a connection of their own and read the row again when it
fires; a lost notification costs at most ``RECHECK_SECONDS``. On SQLite, or
behind a transaction pooler without ``DATABASE_DIRECT_URL``, they poll,
backing off from 20 ms to ``RECHECK_SECONDS``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from django.apps import apps
from django.db import connections

from jobs.pooling import session_conninfo
from jobs.states import TERMINAL
from jobs.wakeups import EVENTS_CHANNEL

RECHECK_SECONDS = 0.5
FIRST_POLL_SECONDS = 0.02

FINISHED_WORKFLOW = frozenset({"succeeded", "failed", "cancelled"})


# The models by name: ``Job.wait`` and ``Workflow.wait`` call in here (no import cycle).
def _model(name: str) -> Any:
    return apps.get_model("controlplane", name)


def wait_for_job(job_id: uuid.UUID | str, timeout: float, *, using: str = "default") -> Any:
    """The job once it has ended, or as it is after ``timeout`` seconds (``Job.DoesNotExist``
    if there is no such job)."""
    return _wait(
        lambda: _model("Job").objects.using(using).get(pk=job_id),
        lambda job: job.status in TERMINAL,
        timeout,
        using,
    )


def wait_for_workflow(
    workflow_id: uuid.UUID | str, timeout: float, *, using: str = "default"
) -> Any:
    """The workflow once it has ended, or as it is after ``timeout`` seconds."""
    return _wait(
        lambda: _model("Workflow").objects.using(using).get(pk=workflow_id),
        lambda run: run.status in FINISHED_WORKFLOW,
        timeout,
        using,
    )


def _wait[T](read: Callable[[], T], done: Callable[[T], bool], timeout: float, using: str) -> T:
    deadline = time.monotonic() + max(0.0, float(timeout))
    value = read()
    if done(value) or timeout <= 0:
        return value
    params = session_conninfo(using) if connections[using].vendor == "postgresql" else None
    if params is None:
        return _poll(read, done, deadline, value)
    with psycopg.connect(autocommit=True, connect_timeout=5, **params) as conn:
        conn.execute(f"LISTEN {EVENTS_CHANNEL}")
        while True:
            value = read()  # after LISTEN: an end written before it is seen here
            left = deadline - time.monotonic()
            if done(value) or left <= 0:
                return value
            for _ in conn.notifies(timeout=min(left, RECHECK_SECONDS), stop_after=1):
                pass


def _poll[T](read: Callable[[], T], done: Callable[[T], bool], deadline: float, value: T) -> T:
    pause = FIRST_POLL_SECONDS
    while not done(value):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, RECHECK_SECONDS)
        value = read()
    return value
