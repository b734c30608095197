"""The worker survives the database going away, and NOTIFY wakes it at once (PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from django.db import connection

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


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


@pytest.mark.skipif(
    os.environ.get("CONTROLPLANE_TEST_PG_RESTART") != "1",
    reason="restarts the PostgreSQL server: set CONTROLPLANE_TEST_PG_RESTART=1 (CI does)",
)
def test_worker_recovers_from_a_postgresql_restart(worker):
    _postgres_only()
    proc = worker()
    running = enqueue("sleep", {"seconds": 1})
    wait_for(lambda: _status(running) == "running", message="running")
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=60,
    )
    connection.close()
    job = enqueue("ping")
    wait_for(lambda: _status(job) == "succeeded", timeout=60, message="job after restart")
    # The sleep job's run hit the outage: it runs again, its attempt not counted.
    wait_for(lambda: _status(running) == "succeeded", timeout=60, message="the sleep job")
    assert Job.objects.get(pk=running.pk).attempts == 1
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
