"""Who ran a job outlives the worker: ``job.started`` records the host and pid.

A worker deletes its row when it stops, so after a deploy the job's
``worker_id`` names nothing; the event written by the claim still says which
host and process ran the attempt.
"""

from __future__ import annotations

import signal
import socket
import uuid

import pytest

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Worker
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_started_event_keeps_the_host_and_pid_after_the_worker_row_is_gone(worker):
    queue = f"who-{uuid.uuid4().hex[:6]}"
    job = enqueue("ping", {}, queue=queue)
    proc = worker(queue)
    wait_for(
        lambda: Job.objects.filter(pk=job.pk, status="succeeded").exists(),
        timeout=30,
        message="the job succeeded",
    )
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    worker_id = Job.objects.values_list("worker_id", flat=True).get(pk=job.pk)
    assert worker_id is not None and not Worker.objects.filter(pk=worker_id).exists()

    fields = JobEvent.objects.get(job_id=job.pk, event="job.started").fields
    assert fields["worker"] == str(worker_id)
    assert fields["host"] == socket.gethostname()
    assert fields["pid"] == proc.pid
    assert fields["attempt"] == 1
