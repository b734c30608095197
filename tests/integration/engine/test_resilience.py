"""The worker survives the database going away, and NOTIFY wakes it at once (PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

stops_postgres = pytest.mark.skipif(
    os.environ.get("CONTROLPLANE_TEST_PG_RESTART") != "1",
    reason="stops the PostgreSQL server: set CONTROLPLANE_TEST_PG_RESTART=1 (CI does)",
)


def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def _terminate_other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@contextmanager
def _postgres_stopped() -> Iterator[None]:
    """The PostgreSQL server down for the block; this process reconnects after it."""
    cluster = [sorted(os.listdir("/etc/postgresql"))[0], "main"]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "stop"], check=True)
    try:
        yield
    finally:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "start"],
            check=True,
            timeout=60,
        )
        connection.close()


def _status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def test_worker_recovers_when_its_connections_are_dropped(worker):
    _postgres_only()
    first = enqueue("ping")
    proc = worker()
    wait_for(lambda: _status(first) == "succeeded", message="first job")
    assert _terminate_other_backends() >= 2  # main loop, heartbeat and listener at least
    second = enqueue("ping")
    wait_for(lambda: _status(second) == "succeeded", timeout=30, message="job after the drop")
    assert proc.popen.poll() is None, proc.output()


@stops_postgres
def test_worker_recovers_from_a_postgresql_restart(worker):
    _postgres_only()
    proc = worker()
    running = enqueue("sleep", {"seconds": 4})
    wait_for(lambda: _status(running) == "running", message="running")
    with _postgres_stopped():
        # Down for longer than the five attempts of an ordinary retry (about 1.5 s
        # with the test knobs): the job's outcome waits for the database instead
        # of being given up, which would leave the job running until its lease ran out.
        wait_for(
            lambda: "what=outage_requeue attempt=7" in proc.output(),
            timeout=60,
            message="the sleep job's outcome retried past five attempts",
        )
    job = enqueue("ping")
    wait_for(lambda: _status(job) == "succeeded", timeout=60, message="job after restart")
    # The sleep job's run hit the outage: it runs again, its attempt not counted,
    # and its timeline says why (job.outage_requeue, within MAX_OUTAGE_REQUEUES).
    wait_for(lambda: _status(running) == "succeeded", timeout=60, message="the sleep job")
    assert Job.objects.get(pk=running.pk).attempts == 1
    assert "job.outage_requeue" in JobEvent.objects.filter(job_id=running.pk).values_list(
        "event", flat=True
    )
    assert proc.popen.poll() is None, proc.output()


@stops_postgres
def test_a_deferral_reached_during_an_outage_is_stored_when_the_database_returns(worker):
    _postgres_only()
    proc = worker()
    job = enqueue("test.defer_after", {"seconds": 1})
    wait_for(lambda: _status(job) == "running", message="running")
    with _postgres_stopped():
        wait_for(
            lambda: "what=defer attempt=7" in proc.output(),
            timeout=60,
            message="the deferral retried past five attempts",
        )
    wait_for(
        lambda: JobEvent.objects.filter(job_id=job.pk, event="job.deferred").exists(),
        timeout=60,
        message="job.deferred",
    )
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.result, stored.error_code) == ("running", {"deferred": True}, "")
    assert proc.popen.poll() is None, proc.output()


def test_notify_wakes_an_idle_worker_quickly(worker):
    _postgres_only()
    proc = worker(env={"CONTROLPLANE_POLL_SECONDS": "30"})
    warm = enqueue("ping")
    wait_for(lambda: _status(warm) == "succeeded", timeout=40, message="listener up")
    time.sleep(0.3)
    job = enqueue("ping")
    wait_for(
        lambda: _status(job) == "succeeded", timeout=5, message="woken by NOTIFY, not the 30 s poll"
    )
    started = JobEvent.objects.get(job_id=job.pk, event="job.started").ts
    assert (started - job.created_at).total_seconds() < 2
    assert proc.popen.poll() is None
