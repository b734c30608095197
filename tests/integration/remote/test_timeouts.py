"""Per-job timeouts for remote workers: the claim says how long a run may take, the
heartbeat fails a held job past it (``JobTimeout``) and says so, and the client's
job reports cancelled at its deadline and sends no late result."""

from __future__ import annotations

import threading

import httpx
import pytest
from controlplane_client import JobManager, TokenApi

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from tests.conftest import wait_for

from .helpers import ECHO, events_of, job_status, register

pytestmark = pytest.mark.django_db(transaction=True)


def heartbeat(api: httpx.Client, worker_id: str, job: dict) -> dict:
    held = [{"id": job["id"], "lease_token": job["lease_token"]}]
    response = api.patch(f"/workers/{worker_id}", json={"held": held})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_heartbeat_fails_a_held_job_past_its_timeout(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "slow"}, timeout_seconds=0.3)
    response = api.post(f"/workers/{worker['id']}/claim", json={"limit": 1})
    [held] = response.json()["jobs"]
    assert held["timeout_seconds"] == 0.3
    # Within its time the job is kept.
    first = heartbeat(api, worker["id"], held)
    assert first["held"] == [held["id"]] and first["timed_out"] == []

    reply = wait_for(
        lambda: (r := heartbeat(api, worker["id"], held))["timed_out"] and r,
        message="a heartbeat past the deadline",
    )
    assert reply["timed_out"] == [held["id"]] and reply["lost"] == [held["id"]]
    assert reply["held"] == [] and reply["cancelled"] == []
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.error_code) == ("failed", "JobTimeout")
    assert events_of(job.pk) == ["job.enqueued", "job.started", "job.timeout"]
    event = JobEvent.objects.get(job_id=job.pk, event="job.timeout")
    assert event.fields["by"] == "heartbeat"
    # A late report is refused and changes nothing.
    late = api.post(
        f"/jobs/{job.pk}/complete", json={"lease_token": held["lease_token"], "result": {}}
    )
    assert late.status_code == 409
    assert job_status(job.pk) == "failed"


def test_the_client_reports_cancelled_at_the_deadline_and_sends_no_late_result(server, token):
    seen: dict[str, object] = {}
    returned = threading.Event()
    manager = JobManager(
        TokenApi(server.url, token), websocket=False, long_poll=1.0, shutdown_grace=1.0
    )

    @manager.operation("remote.patient", queue="remote")
    def patient(job):
        seen["cancelled"] = job.wait_cancelled(30)
        seen["reason"] = job.lost_reason
        returned.set()
        return {"late": True}

    manager.connect()
    try:
        job = enqueue("remote.patient", {}, timeout_seconds=0.5)
        assert returned.wait(15), "the handler never saw its timeout"
        assert seen == {"cancelled": True, "reason": "timed_out"}
        wait_for(lambda: job_status(job.pk) == "failed", message="the heartbeat to fail it")
        wait_for(lambda: not manager.held(), message="the client to let go of it")
    finally:
        manager.disconnect()
    row = Job.objects.get(pk=job.pk)
    assert (row.error_code, row.result) == ("JobTimeout", None)
    assert events_of(job.pk) == ["job.enqueued", "job.started", "job.timeout"]
    assert JobEvent.objects.get(job_id=job.pk, event="job.timeout").fields["by"] == "heartbeat"


def test_a_claim_without_a_timeout_says_so(api, server):
    worker = register(api, [ECHO])
    enqueue("remote.echo", {"text": "hi"})
    [held] = api.post(f"/workers/{worker['id']}/claim", json={"limit": 1}).json()["jobs"]
    assert held["timeout_seconds"] is None
