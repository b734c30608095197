"""Lease tokens are honoured only from the account whose worker claimed the job.

An account with ``controlplane.run_remote_jobs`` that learned a token (a log line, a
proxy) cannot emit to, complete or fail someone else's job, or keep its lease
alive: such a call is a 403 in the one error shape and changes nothing; the owner
keeps working as before, and a stale token still gets 409 from anyone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Worker, WorkerKind

from .helpers import ECHO, Server, register

# The intruder's own operation: remote.echo belongs to the account that declared it first.
INTRUDER_OP = {"name": "intruder.op", "queue": "remote", "payload_schema": {"type": "object"}}

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def intruder(server: Server, make_token) -> Iterator[httpx.Client]:
    """Another remote-worker account, with a worker of its own for the same operation."""
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Token {make_token('intruder')}"},
        timeout=40,
        trust_env=False,
    ) as client:
        yield client


def _claim(api: httpx.Client, worker_id: str) -> dict[str, Any]:
    response = api.post(f"/workers/{worker_id}/claim", json={"limit": 1})
    assert response.status_code == 200, response.text
    [job] = response.json()["jobs"]
    return job


def _state(job_id: Any) -> tuple[Any, ...]:
    row = Job.objects.values_list(
        "status",
        "last_event_seq",
        "leased_until",
        "lease_token",
        "result",
        "progress_current",
        "error_code",
        "attempts",
    ).get(pk=job_id)
    return (*row, JobEvent.objects.filter(job_id=job_id).count())


def _refused(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 403, (response.request.url, response.status_code, response.text)
    body = response.json()
    assert set(body) == {"message", "errors"} and "another account" in body["message"], body
    return body


def _reports(job_id: str, token: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("POST", f"/jobs/{job_id}/events", {"lease_token": token, "event": "x.y"}),
        (
            "POST",
            f"/jobs/{job_id}/events",
            {"lease_token": token, "event": "x.p", "fields": {"_progress_current": 9}},
        ),
        ("POST", f"/jobs/{job_id}/complete", {"lease_token": token, "result": {"stolen": 1}}),
        ("POST", f"/jobs/{job_id}/complete", {"lease_token": token, "deferred": True}),
        (
            "POST",
            f"/jobs/{job_id}/fail",
            {"lease_token": token, "error_code": "X", "error_message": "x", "retryable": True},
        ),
        (
            "POST",
            f"/jobs/{job_id}/fail",
            {"lease_token": token, "error_code": "X", "error_message": "x"},
        ),
    ]


def test_another_account_with_the_token_is_refused_and_changes_nothing(api, intruder, server):
    owner = register(api)
    theirs = register(intruder, [INTRUDER_OP])  # remote.echo is the owner's: a 409 for it
    job = enqueue("remote.echo", {"text": "mine"})
    held = _claim(api, owner["id"])
    token = held["lease_token"]
    before = _state(job.pk)
    for method, path, body in _reports(held["id"], token):
        _refused(intruder.request(method, path, json=body))
        assert _state(job.pk) == before, (method, path, body)
    # Its own worker's heartbeat may not extend a lease it does not hold either.
    heartbeat = intruder.patch(
        f"/workers/{theirs['id']}", json={"held": [{"id": held["id"], "lease_token": token}]}
    )
    _refused(heartbeat)
    assert _state(job.pk) == before
    # The owner works exactly as before.
    r = api.post(f"/jobs/{job.pk}/events", json={"lease_token": token, "event": "echo.step"})
    assert r.status_code == 201, r.text
    r = api.patch(
        f"/workers/{owner['id']}", json={"held": [{"id": held["id"], "lease_token": token}]}
    )
    assert r.status_code == 200 and r.json()["held"] == [held["id"]], r.text
    r = api.post(f"/jobs/{job.pk}/complete", json={"lease_token": token, "result": {"ok": 1}})
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    assert Job.objects.get(pk=job.pk).result == {"ok": 1}


def test_a_stale_token_is_still_a_409_for_everyone(api, intruder, server):
    owner = register(api)
    register(intruder, [INTRUDER_OP])
    job = enqueue("remote.echo", {"text": "x"})
    token = _claim(api, owner["id"])["lease_token"]
    stranger = str(uuid.uuid4())
    for client in (api, intruder):
        r = client.post(f"/jobs/{job.pk}/complete", json={"lease_token": stranger})
        assert r.status_code == 409, r.text
    assert api.post(f"/jobs/{job.pk}/complete", json={"lease_token": token}).status_code == 200
    for client in (api, intruder):  # the token of a finished job is stale too
        r = client.post(f"/jobs/{job.pk}/events", json={"lease_token": token, "event": "x.y"})
        assert r.status_code == 409, r.text
        r = client.post(
            f"/jobs/{job.pk}/fail",
            json={"lease_token": token, "error_code": "X", "error_message": "x"},
        )
        assert r.status_code == 409, r.text
    assert Job.objects.get(pk=job.pk).status == "succeeded"


def test_a_job_a_local_worker_holds_is_out_of_reach_over_http(api, server):
    register(api)
    local = Worker.objects.create(name="local", kind=WorkerKind.LOCAL, queues=["remote"])
    job = enqueue("remote.echo", {"text": "x"})
    [held] = claim_jobs(queues=["remote"], worker_id=local.pk, limit=1, lease_seconds=30)
    before = _state(job.pk)
    for method, path, body in _reports(str(job.pk), str(held.lease_token)):
        _refused(api.request(method, path, json=body))
    assert _state(job.pk) == before


def test_a_successor_worker_of_the_same_account_finishes_a_deferred_job(api, server):
    """Ownership is the account's: a restarted client (a new worker row) keeps its jobs."""
    first = register(api)
    job = enqueue("remote.echo", {"text": "x"})
    token = _claim(api, first["id"])["lease_token"]
    body = {"lease_token": token, "deferred": True}
    assert api.post(f"/jobs/{job.pk}/complete", json=body).json()["status"] == "running"
    second = register(api, [ECHO])
    held = [{"id": str(job.pk), "lease_token": token}]
    r = api.patch(f"/workers/{second['id']}", json={"held": held})
    assert r.status_code == 200 and r.json()["held"] == [str(job.pk)], r.text
    r = api.post(f"/jobs/{job.pk}/complete", json={"lease_token": token, "result": {"n": 1}})
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
