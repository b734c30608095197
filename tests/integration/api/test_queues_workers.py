"""GET /queues, pause and resume, GET /workers and /workers/<id>."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.claims import claim_jobs
from jobs.models import BatchMessage, Job, Queue, Worker
from tests.factories import cancelled, failed, queued, succeeded

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db

QUEUE_KEYS = {
    "name",
    "kind",
    "counts",
    "oldest_queued_age",
    "running",
    "throughput",
    "paused",
    "concurrency_cap",
    "pending_messages",
}
ZERO = {"queued": 0, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0}


def by_name(body) -> dict[str, dict]:
    return {q["name"]: q for q in body}


def test_queues_union_rows_and_job_queues_with_every_figure(viewer):
    Queue.objects.create(name="idle", paused=True, concurrency_cap=4)
    succeeded(queue="work")
    failed(queue="work")
    cancelled(queue="work")
    old = queued(queue="work")
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(seconds=90))
    queued(queue="work")
    queued(queue="work.batch")
    response = viewer.get("/queues")
    assert response.status_code == 200
    queues = by_name(response.json())
    assert {"idle", "work", "work.batch"} <= set(queues)
    assert QUEUE_KEYS <= set(queues["work"])
    work = queues["work"]
    assert work["counts"] == {
        "queued": 2,
        "running": 0,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
    }
    assert work["kind"] == "job" and work["paused"] is False and work["running"] == 0
    assert 89 <= work["oldest_queued_age"] < 200
    assert work["throughput"] == {"last_minute": 3, "last_hour": 3}
    idle = queues["idle"]
    assert idle["counts"] == ZERO and idle["oldest_queued_age"] is None
    assert idle["paused"] is True and idle["concurrency_cap"] == 4
    assert queues["work.batch"]["kind"] == "batch"
    assert [q["name"] for q in response.json()] == sorted(queues)


def test_running_count_and_pending_batch_messages(viewer):
    parent = queued(queue="fan")
    claim_jobs(queues=["fan"], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    BatchMessage.objects.create(queue="fan.batch", parent=parent, operation="x", batch_index=0)
    queues = by_name(viewer.get("/queues/").json())
    assert queues["fan"]["running"] == 1 and queues["fan"]["counts"]["running"] == 1
    assert queues["fan"]["oldest_queued_age"] is None
    assert queues["fan.batch"]["pending_messages"] == 1 and queues["fan.batch"]["kind"] == "batch"


def test_one_queue(viewer):
    queued(queue="solo")
    body = viewer.get("/queues/solo").json()
    assert body["name"] == "solo" and body["counts"]["queued"] == 1
    assert viewer.get("/queues/never-used/").json()["counts"] == ZERO


def test_pause_and_resume_create_and_update_the_row(operator):
    response = operator.post("/queues/fresh.batch/pause")
    assert response.status_code == 200, response.content
    assert response.json()["paused"] is True and response.json()["kind"] == "batch"
    assert Queue.objects.get(name="fresh.batch").paused is True
    response = operator.post("/queues/fresh.batch/resume/")
    assert response.json()["paused"] is False
    assert Queue.objects.get(name="fresh.batch").paused is False
    queued(queue="busy")
    body = operator.post("/queues/busy/pause").json()
    assert body["paused"] is True and body["counts"]["queued"] == 1 and body["kind"] == "job"


def test_pause_is_post_only(operator):
    assert_error_shape(operator.get("/queues/a/pause"), 405)


def test_workers_with_their_current_jobs(viewer):
    busy = Worker.objects.create(name="w1", hostname="host-a", pid=41, queues=["wq"], concurrency=2)
    idle = Worker.objects.create(
        name="w2",
        kind="remote",
        hostname="host-b",
        queues=["x"],
        last_heartbeat=timezone.now() - timedelta(seconds=30),
    )
    jobs = [queued(queue="wq") for _ in range(2)]
    claim_jobs(queues=["wq"], worker_id=busy.pk, limit=2, lease_seconds=30)
    response = viewer.get("/workers")
    assert response.status_code == 200
    workers = {w["id"]: w for w in response.json()}
    one = workers[str(busy.pk)]
    assert {
        "id",
        "name",
        "kind",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started_at",
        "last_heartbeat",
        "heartbeat_age",
        "current_jobs",
    } <= set(one)
    assert sorted(one["current_jobs"]) == sorted(str(j.pk) for j in jobs)
    assert (one["hostname"], one["pid"], one["queues"]) == ("host-a", 41, ["wq"])
    assert one["kind"] == "local"
    two = workers[str(idle.pk)]
    assert two["current_jobs"] == [] and two["kind"] == "remote" and two["heartbeat_age"] >= 29
    detail = viewer.get(f"/workers/{busy.pk}/").json()
    assert detail == {**one, "heartbeat_age": detail["heartbeat_age"]}


def test_unknown_workers_are_404(viewer):
    assert_error_shape(viewer.get(f"/workers/{uuid.uuid4()}"), 404)
    assert_error_shape(viewer.get("/workers/not-a-uuid"), 404)


def test_remote_methods_reach_the_remote_worker_handlers(api_for):
    remote = api_for("remote")
    body = {"name": "r1", "queues": ["default"], "operations": ["ping"]}
    response = remote.post("/workers", body)
    assert response.status_code not in (401, 403, 404, 405), response.content
    assert response["Content-Type"].startswith("application/json")


def test_remote_only_routes_are_not_swallowed_by_job_routes(api_for):
    """/jobs/<id>/complete, /fail and /workers/<id>/claim belong to the remote-worker views."""
    remote = api_for("remote")
    job = queued()
    worker = Worker.objects.create(name="w", kind="remote")
    paths = (f"/jobs/{job.pk}/complete", f"/jobs/{job.pk}/fail/", f"/workers/{worker.pk}/claim")
    for path in paths:
        response = remote.post(path, {"lease_token": str(uuid.uuid4())})
        assert response.status_code != 405, (path, response.content)
        assert b"There is no API route" not in response.content, path


def test_throughput_tells_the_last_minute_from_the_last_hour(viewer):
    now = timezone.now()
    finished = {
        "just now": succeeded(queue="tp"),
        "50 s ago": failed(queue="tp"),
        "70 s ago": cancelled(queue="tp"),
        "59 min ago": succeeded(queue="tp"),
        "2 h ago": succeeded(queue="tp"),
    }
    for label, ago in (
        ("50 s ago", timedelta(seconds=50)),
        ("70 s ago", timedelta(seconds=70)),
        ("59 min ago", timedelta(minutes=59)),
        ("2 h ago", timedelta(hours=2)),
    ):
        Job.objects.filter(pk=finished[label].pk).update(finished_at=now - ago)
    queued(queue="tp")  # not finished: counts in neither
    expected = {"last_minute": 2, "last_hour": 4}
    assert viewer.get("/queues/tp").json()["throughput"] == expected
    assert by_name(viewer.get("/queues").json())["tp"]["throughput"] == expected
