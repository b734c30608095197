"""The remote-worker protocol over real HTTP (daphne), driven with httpx from the test."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from jobs.enqueue import enqueue
from jobs.exceptions import EnqueueError
from jobs.models import Job, RemoteOperation, Worker
from jobs.transitions import cancel_job
from tests.conftest import wait_for

from .helpers import ECHO, OTHER, events_of, job_status, register

pytestmark = pytest.mark.django_db(transaction=True)


def claim(api: httpx.Client, worker_id: str, **body) -> list[dict]:
    response = api.post(f"/workers/{worker_id}/claim", json=body)
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def test_register_creates_a_remote_worker_of_the_user(api, server):
    body = register(api, [ECHO, OTHER], name="gpu-box", concurrency=2)
    assert body["heartbeat_interval"] > 0 and body["lease_seconds"] > 0
    assert body["websocket"] == f"/ws/workers/{body['id']}"
    worker = Worker.objects.get(pk=body["id"])
    assert (worker.kind, worker.name, worker.concurrency) == ("remote", "gpu-box", 2)
    assert worker.user.username == "remote"
    assert worker.operations == ["remote.echo", "remote.other"]
    assert set(worker.queues) == {"remote", "default"}  # the queues of its operations


def test_claim_starts_jobs_of_its_operations_only(api, server):
    worker = register(api)
    theirs = enqueue("ping", queue="remote")
    ours = enqueue("remote.echo", {"text": "hi"})
    jobs = claim(api, worker["id"], limit=5)
    assert [j["id"] for j in jobs] == [str(ours.pk)]
    job = jobs[0]
    assert job["operation"] == "remote.echo" and job["queue"] == "remote"
    assert job["payload"] == {"text": "hi"} and job["attempt"] == 1 and job["lease_token"]
    assert job_status(ours.pk) == "running" and job_status(theirs.pk) == "queued"
    assert events_of(ours.pk) == ["job.enqueued", "job.started"]
    assert str(Job.objects.get(pk=ours.pk).worker_id) == worker["id"]


def test_events_progress_and_complete(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "hi"})
    [held] = claim(api, worker["id"])
    token = held["lease_token"]
    r = api.post(
        f"/jobs/{job.pk}/events/",
        json={
            "lease_token": token,
            "event": "echo.step",
            "message": "half way",
            "fields": {"_progress_current": 1, "_progress_total": 2},
        },
    )
    assert r.status_code == 201, r.text
    assert Job.objects.values_list("progress_current", "progress_total").get(pk=job.pk) == (1, 2)
    r = api.post(f"/jobs/{job.pk}/complete", json={"lease_token": token, "result": {"ok": 1}})
    assert r.status_code == 200 and r.json()["status"] == "succeeded", r.text
    job.refresh_from_db()
    assert (job.status, job.result, job.lease_token) == ("succeeded", {"ok": 1}, None)
    assert events_of(job.pk)[-2:] == ["echo.step", "job.succeeded"]
    # A job without a result completes with null.
    other = enqueue("remote.echo", {"text": "none"})
    [held] = claim(api, worker["id"])
    r = api.post(
        f"/jobs/{other.pk}/complete", json={"lease_token": held["lease_token"], "result": None}
    )
    assert r.status_code == 200 and Job.objects.get(pk=other.pk).result is None


def test_engine_event_names_are_reserved(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "hi"})
    [held] = claim(api, worker["id"])
    for name in ("job.succeeded", "job.log", "job.log_truncated"):  # logs: POST .../logs
        r = api.post(
            f"/jobs/{job.pk}/events",
            json={"lease_token": held["lease_token"], "event": name},
        )
        assert r.status_code == 400 and "event" in r.json()["errors"], name
    assert job_status(job.pk) == "running"


def test_wrong_or_stale_token_is_refused_and_changes_nothing(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "hi"})
    [held] = claim(api, worker["id"])
    before = events_of(job.pk)
    wrong = str(uuid.uuid4())
    for action, body in (
        ("complete", {"result": {"forged": True}}),
        ("fail", {"error_code": "X", "error_message": "forged"}),
        ("events", {"event": "forged.event"}),
    ):
        r = api.post(f"/jobs/{job.pk}/{action}", json={"lease_token": wrong, **body})
        assert r.status_code == 409, (action, r.text)
        assert set(r.json()) == {"message", "errors"}
    job.refresh_from_db()
    assert (job.status, job.result, str(job.lease_token)) == ("running", None, held["lease_token"])
    assert events_of(job.pk) == before
    # Requeued by a disconnect, then claimed again: the first token is stale.
    api.delete(f"/workers/{worker['id']}")
    again = register(api)
    [second] = claim(api, again["id"])
    assert second["id"] == held["id"] and second["lease_token"] != held["lease_token"]
    r = api.post(f"/jobs/{job.pk}/complete", json={"lease_token": held["lease_token"], "result": 1})
    assert r.status_code == 409
    assert job_status(job.pk) == "running"
    r = api.post(
        f"/jobs/{job.pk}/complete", json={"lease_token": second["lease_token"], "result": 2}
    )
    assert r.status_code == 200
    assert Job.objects.get(pk=job.pk).result == 2


def test_fail_retryable_backs_off_then_fails_for_good(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "x"}, max_attempts=2)
    [held] = claim(api, worker["id"])
    r = api.post(
        f"/jobs/{job.pk}/fail",
        json={
            "lease_token": held["lease_token"],
            "error_code": "Boom",
            "error_message": "boom",
            "retryable": True,
        },
    )
    assert r.json()["status"] == "queued"
    job.refresh_from_db()
    assert job.status == "queued" and job.run_after > job.created_at and job.error_code == "Boom"
    assert events_of(job.pk)[-1] == "job.retry_scheduled"
    second = wait_for(lambda: claim(api, worker["id"], wait=2), message="the retry to be claimable")
    assert second[0]["attempt"] == 2
    r = api.post(
        f"/jobs/{job.pk}/fail",
        json={
            "lease_token": second[0]["lease_token"],
            "error_code": "Boom",
            "error_message": "again",
            "retryable": True,
        },
    )
    assert r.json()["status"] == "failed"
    assert job_status(job.pk) == "failed"


def test_deferred_job_stays_held_and_is_completed_later_with_its_token(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "x"})
    [held] = claim(api, worker["id"])
    token = held["lease_token"]
    r = api.post(
        f"/jobs/{job.pk}/complete",
        json={"lease_token": token, "result": {"batches": 3}, "deferred": True},
    )
    assert r.status_code == 200 and r.json()["status"] == "running"
    job.refresh_from_db()
    assert (job.status, str(job.lease_token), job.result) == ("running", token, {"batches": 3})
    assert events_of(job.pk)[-1] == "job.deferred"
    # Heartbeats (with or without a held list) keep extending its lease.
    before = job.leased_until
    time.sleep(0.01)
    assert api.patch(f"/workers/{worker['id']}", json={}).json()["held"] == [str(job.pk)]
    assert Job.objects.get(pk=job.pk).leased_until > before
    # Another token cannot close it; the holder's token can.
    stranger = {"lease_token": str(uuid.uuid4()), "result": {"done": True}}
    assert api.post(f"/jobs/{job.pk}/complete", json=stranger).status_code == 409
    r = api.post(f"/jobs/{job.pk}/complete", json={"lease_token": token, "result": {"n": 3}})
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    job.refresh_from_db()
    assert (job.status, job.result, job.lease_token) == ("succeeded", {"n": 3}, None)
    assert events_of(job.pk)[-2:] == ["job.deferred", "job.succeeded"]


def test_deferred_job_can_be_failed_later_and_is_requeued_on_disconnect(api, server):
    worker = register(api, concurrency=2)
    failing = enqueue("remote.echo", {"text": "a"})
    leaving = enqueue("remote.echo", {"text": "b"})
    held = {j["id"]: j["lease_token"] for j in claim(api, worker["id"], limit=2)}
    for job_id, token in held.items():
        body = {"lease_token": token, "deferred": True}
        assert api.post(f"/jobs/{job_id}/complete", json=body).json()["status"] == "running"
    failure = {
        "lease_token": held[str(failing.pk)],
        "error_code": "Upstream",
        "error_message": "the callback never came",
    }
    assert api.post(f"/jobs/{failing.pk}/fail", json=failure).json()["status"] == "failed"
    # Still held: a graceful disconnect gives it back to the queue.
    assert api.delete(f"/workers/{worker['id']}").json()["requeued"] == [str(leaving.pk)]
    assert job_status(leaving.pk) == "queued"


def test_heartbeat_extends_leases_and_reports_lost_jobs(api, server):
    worker = register(api, concurrency=2)
    kept = enqueue("remote.echo", {"text": "a"})
    gone = enqueue("remote.echo", {"text": "b"})
    held = {j["id"]: j for j in claim(api, worker["id"], limit=2)}
    before = Job.objects.get(pk=kept.pk).leased_until
    Worker.objects.filter(pk=worker["id"]).update(last_heartbeat="2000-01-01T00:00:00Z")
    cancel_job(gone.pk, reason="operator")
    time.sleep(0.01)
    r = api.patch(
        f"/workers/{worker['id']}",
        json={
            "held": [{"id": i, "lease_token": j["lease_token"]} for i, j in held.items()],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["held"] == [str(kept.pk)]
    assert body["lost"] == [str(gone.pk)] and body["cancelled"] == [str(gone.pk)]
    assert Job.objects.get(pk=kept.pk).leased_until > before
    assert Worker.objects.get(pk=worker["id"]).last_heartbeat.year > 2000
    # Without a list the server extends what it knows the worker holds.
    assert api.patch(f"/workers/{worker['id']}/").json()["held"] == [str(kept.pk)]


def test_disconnect_requeues_held_jobs_without_counting_the_attempt(api, server):
    worker = register(api)
    job = enqueue("remote.echo", {"text": "x"})
    claim(api, worker["id"])
    r = api.delete(f"/workers/{worker['id']}/")
    assert r.status_code == 200 and r.json()["requeued"] == [str(job.pk)]
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id, job.lease_token) == ("queued", 0, None, None)
    assert events_of(job.pk)[-1] == "job.requeued"
    assert not Worker.objects.filter(pk=worker["id"]).exists()
    assert api.patch(f"/workers/{worker['id']}").status_code == 404
    assert api.post(f"/workers/{worker['id']}/claim").status_code == 404


def test_long_poll_wakes_when_a_job_is_enqueued(api, server):
    worker = register(api)
    got: dict = {}

    def poll() -> None:
        started = time.monotonic()
        got["jobs"] = claim(api, worker["id"], wait=20)
        got["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    job = enqueue("remote.echo", {"text": "late"})
    thread.join(timeout=15)
    assert [j["id"] for j in got["jobs"]] == [str(job.pk)]
    assert 0.4 < got["seconds"] < 5


def test_long_poll_returns_empty_after_waiting(api, server):
    worker = register(api)
    started = time.monotonic()
    assert claim(api, worker["id"], wait=0.6) == []
    assert 0.5 < time.monotonic() - started < 5


def test_paused_queue_is_not_served(api, server):
    from jobs.models import Queue

    worker = register(api)
    Queue.objects.create(name="remote", paused=True)
    job = enqueue("remote.echo", {"text": "x"})
    assert claim(api, worker["id"]) == []
    Queue.objects.filter(name="remote").update(paused=False)
    assert [j["id"] for j in claim(api, worker["id"])] == [str(job.pk)]


def test_declared_operation_is_validated_at_enqueue(api, server, make_token):
    operator = httpx.Client(
        base_url=server.url,
        trust_env=False,
        headers={
            "Authorization": f"Token {make_token('operator', remote=False, extra=('add_job',))}"
        },
    )
    register(api)
    assert RemoteOperation.objects.get(name="remote.echo").queue == "remote"
    with pytest.raises(EnqueueError) as refused:
        enqueue("remote.echo", {"text": 5})
    assert "payload.text" in refused.value.errors
    with operator:
        r = operator.post("/jobs", json={"operation": "remote.echo", "payload": {}})
        assert r.status_code == 400 and "payload.text" in r.json()["errors"]
        r = operator.post("/jobs", json={"operation": "remote.echo", "payload": {"text": "ok"}})
    assert r.status_code == 201, r.text
    assert r.json()["queue"] == "remote" and r.json()["max_attempts"] == 3


def test_registration_refuses_unknown_or_invalid_operations(api, server):
    cases = [
        (["no.such.op"], "operations.0.name"),
        (
            [{"name": "bad.schema", "payload_schema": {"type": "nonsense"}}],
            "operations.0.payload_schema",
        ),
        ([], "operations"),
    ]
    for operations, field in cases:
        r = api.post("/workers", json={"name": "w", "operations": operations})
        assert r.status_code == 400, r.text
        assert field in r.json()["errors"], r.json()
    # A local operation is not served remotely (REMOTE_MAY_SERVE_LOCAL is off).
    r = api.post("/workers", json={"name": "w", "operations": [{"name": "ping", "queue": "x"}]})
    assert r.status_code == 403 and "operations.0.name" in r.json()["errors"], r.text
    assert not Worker.objects.exists() and not RemoteOperation.objects.exists()


def test_orphan_operation_is_hidden_then_back_when_declared_again(api, server, settings):
    from jobs.remote_operations import soft_delete_orphan_operations

    # No grace after the last worker left (test_operation_grace.py covers the grace).
    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REMOTE_OPERATION_GRACE_SECONDS": 0}

    worker = register(api)
    pending = enqueue("remote.echo", {"text": "x"})
    api.delete(f"/workers/{worker['id']}")
    # A pending job keeps it alive.
    assert RemoteOperation.objects.get(name="remote.echo").deleted is False
    Job.objects.filter(pk=pending.pk).delete()
    assert soft_delete_orphan_operations() == 1
    assert soft_delete_orphan_operations() == 0  # safe to call again
    with pytest.raises(EnqueueError) as refused:
        enqueue("remote.echo", {"text": "x"})
    assert "Unknown operation" in refused.value.errors["operation"][0]
    # A plain name brings a hidden operation back with its last declaration.
    register(api, ["remote.echo"])
    assert RemoteOperation.objects.get(name="remote.echo").deleted is False
    assert enqueue("remote.echo", {"text": "back"}).queue == "remote"


def test_only_live_workers_keep_an_operation_visible(api, server, settings):
    """A registered but silent worker (heartbeat past the timeout, not swept yet) provides
    nothing: its operations are hidden; a fresh heartbeat is what counts."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.conf import knob
    from jobs.remote_operations import soft_delete_orphan_operations

    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REMOTE_OPERATION_GRACE_SECONDS": 0}
    worker = register(api)
    assert soft_delete_orphan_operations() == 0  # alive: kept
    timeout = float(knob("WORKER_TIMEOUT_SECONDS"))
    stale = timezone.now() - timedelta(seconds=timeout + 5)
    Worker.objects.filter(pk=worker["id"]).update(last_heartbeat=stale)
    assert Worker.objects.filter(pk=worker["id"]).exists()
    assert soft_delete_orphan_operations() == 1
    assert RemoteOperation.objects.get(name="remote.echo").deleted is True


def test_permission_and_ownership(server, make_token, api):
    plain = make_token("viewer", remote=False)
    anonymous = httpx.Client(base_url=server.url, trust_env=False)
    viewer = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Token {plain}"}, trust_env=False
    )
    other = httpx.Client(
        base_url=server.url,
        trust_env=False,
        headers={"Authorization": f"Token {make_token('other')}"},
    )
    worker = register(api)
    job = enqueue("remote.echo", {"text": "x"})
    [held] = claim(api, worker["id"])
    token = held["lease_token"]
    with anonymous, viewer, other:
        for client, codes in ((anonymous, {401, 403}), (viewer, {403})):
            calls = [
                client.post("/workers", json={"operations": [ECHO]}),
                client.patch(f"/workers/{worker['id']}"),
                client.post(f"/workers/{worker['id']}/claim"),
                client.post(f"/jobs/{job.pk}/events", json={"lease_token": token, "event": "x.y"}),
                client.post(f"/jobs/{job.pk}/complete", json={"lease_token": token}),
                client.post(
                    f"/jobs/{job.pk}/fail",
                    json={"lease_token": token, "error_code": "x", "error_message": "x"},
                ),
                client.delete(f"/workers/{worker['id']}"),
            ]
            for r in calls:
                assert r.status_code in codes, (
                    r.request.method,
                    r.request.url,
                    r.status_code,
                    r.text,
                )
                assert set(r.json()) == {"message", "errors"}
        # Another remote user cannot drive this worker.
        assert other.patch(f"/workers/{worker['id']}").status_code == 404
        assert other.post(f"/workers/{worker['id']}/claim").status_code == 404
        assert other.delete(f"/workers/{worker['id']}").status_code == 404
    assert job_status(job.pk) == "running"
    assert Worker.objects.filter(pk=worker["id"]).exists()


def test_a_claim_answer_carries_the_security_headers_of_every_response(api):
    """The claim (an async view) skips the middleware stack; its answers still say nosniff."""
    worker = register(api)
    claimed = api.post(f"/workers/{worker['id']}/claim", json={"limit": 1, "wait": 0.2})
    listed = api.get("/jobs")  # a sync view, through the middleware (403: a worker's account)
    assert claimed.status_code == 200 and listed.status_code == 403, listed.text
    for response in (claimed, listed):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
    refused = api.post(f"/workers/{uuid.uuid4()}/claim", json={"limit": 1})
    assert refused.status_code == 404 and refused.json()["message"]
    assert refused.headers["x-content-type-options"] == "nosniff"
