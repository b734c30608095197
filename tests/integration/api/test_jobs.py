"""GET/POST /jobs, GET /jobs/<id>, cancel and retry of one job."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs.models import Job
from tests.factories import (
    cancelled,
    failed,
    fresh,
    queued,
    running,
    succeeded,
    timeline,
)

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db

JOB_KEYS = {
    "id",
    "operation",
    "queue",
    "status",
    "priority",
    "payload",
    "result",
    "error_code",
    "error_message",
    "attempts",
    "max_attempts",
    "parent",
    "progress_current",
    "progress_total",
    "created_at",
    "run_after",
    "started_at",
    "finished_at",
    "leased_until",
    "worker",
}


def test_enqueue_returns_201_and_the_job(operator):
    response = operator.post("/jobs", {"operation": "ping", "payload": {}, "priority": 5})
    assert response.status_code == 201, response.content
    body = response.json()
    assert JOB_KEYS <= set(body)
    assert body["status"] == "queued" and body["operation"] == "ping" and body["priority"] == 5
    assert body["queue"] == "default" and body["parent"] is None and body["worker"] is None
    [job] = assert_enqueued("ping", queue="default", payload={}, count=1)
    assert str(job.pk) == body["id"] and job.priority == 5
    assert timeline(job) == [(1, "job.enqueued")]


def test_enqueue_with_every_option(operator):
    parent = queued()
    run_after = (timezone.now() + timedelta(hours=1)).isoformat()
    response = operator.post(
        "/jobs/",
        {
            "operation": "sleep",
            "payload": {"seconds": 0.1},
            "queue": "special",
            "priority": -100,
            "run_after": run_after,
            "max_attempts": 4,
            "parent": str(parent.pk),
            "idempotency_key": "k-1",
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["queue"], body["priority"], body["max_attempts"]) == ("special", -100, 4)
    assert body["parent"] == str(parent.pk) and body["idempotency_key"] == "k-1"
    [job] = assert_enqueued("sleep", queue="special", parent=parent, count=1)
    assert (str(job.pk), job.payload) == (body["id"], {"seconds": 0.1})
    assert job.run_after > timezone.now() + timedelta(minutes=59)


def test_the_enqueue_answer_is_the_job_as_stored(operator, viewer):
    """POST /jobs answers from the row it inserted, not a re-read: it must say what a
    GET of the same job says, every field (timestamps, payload, options) alike."""
    body = {
        "operation": "sleep",
        "payload": {"seconds": 0.25, "emit_every": 0.1},
        "queue": "as-stored",
        "priority": 7,
        "run_after": (timezone.now() + timedelta(hours=2)).isoformat(),
        "expires_at": (timezone.now() + timedelta(days=1)).isoformat(),
        "max_attempts": 2,
        "unique_key": "as-stored-1",
        "timeout_seconds": 12.5,
    }
    posted = operator.post("/jobs", body)
    assert posted.status_code == 201, posted.content
    answer = posted.json()
    assert answer.pop("duplicate") is False
    read = viewer.get(f"/jobs/{answer['id']}").json()
    read.pop("children")
    assert answer == read


def test_enqueue_payload_defaults_to_an_empty_object(operator):
    response = operator.post("/jobs", {"operation": "ping"})
    assert response.status_code == 201 and response.json()["payload"] == {}


def test_idempotent_repeat_returns_the_first_job_with_200(operator):
    first = operator.post("/jobs", {"operation": "ping", "idempotency_key": "same"})
    again = operator.post("/jobs", {"operation": "ping", "idempotency_key": "same"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    [job] = assert_enqueued("ping", count=1)
    assert (str(job.pk), job.unique_key) == (first.json()["id"], "same")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"operation": "no-such-op", "payload": {}}, "operation"),
        ({"operation": "sleep", "payload": {"seconds": "long"}}, "payload"),
        ({"operation": "ping", "payload": [1, 2]}, "payload"),
        ({"operation": "ping", "payload": "text"}, "payload"),
        ({"operation": "ping", "priority": 101}, "priority"),
        ({"operation": "ping", "priority": -101}, "priority"),
        ({"operation": "ping", "priority": "high"}, "priority"),
        ({"operation": "ping", "max_attempts": 0}, "max_attempts"),
        ({"operation": "ping", "run_after": "tomorrow"}, "run_after"),
        ({"operation": "ping", "parent": "not-a-uuid"}, "parent"),
        ({"operation": "ping", "parent": str(uuid.uuid4())}, "parent"),
        ({"payload": {}}, "operation"),
        ({"operation": "ping", "queue": ""}, "queue"),
        ({"operation": "ping", "colour": "red"}, "colour"),
    ],
)
def test_enqueue_refusals_name_the_field(operator, body, field):
    response = operator.post("/jobs", body)
    error = assert_error_shape(response, 400)
    assert any(k == field or k.startswith(f"{field}.") for k in error["errors"]), error
    refute_enqueued()


def test_enqueue_refuses_a_payload_over_the_payload_limit(operator, settings):
    settings.CONTROLPLANE = {"MAX_PAYLOAD_BYTES": 1000}
    payload = {"seconds": 1, "x": "y" * 2000}
    response = operator.post("/jobs", {"operation": "sleep", "payload": payload})
    error = assert_error_shape(response, 400)
    assert "payload" in error["errors"]


def test_enqueue_refuses_a_body_that_is_not_an_object(operator):
    assert_error_shape(operator.post("/jobs", [{"operation": "ping"}]), 400)


def test_detail_has_every_field_and_children_counts(viewer):
    parent = queued()
    for _ in range(2):
        queued(parent=parent.pk)
    cancelled(parent=parent.pk)
    response = viewer.get(f"/jobs/{parent.pk}")
    assert response.status_code == 200
    body = response.json()
    assert JOB_KEYS <= set(body)
    assert body["children"] == {
        "queued": 2,
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "cancelled": 1,
    }
    assert viewer.get(f"/jobs/{parent.pk}/").json() == body


def test_detail_of_a_finished_job(viewer):
    job = succeeded()
    body = viewer.get(f"/jobs/{job.pk}").json()
    assert body["status"] == "succeeded" and body["result"] == {"pong": True}
    assert body["finished_at"] and body["started_at"] and body["attempts"] == 1
    assert body["worker"] is not None and body["leased_until"] is None


def test_list_is_newest_first_and_filters(viewer):
    c = succeeded(queue="alpha")
    b = failed(queue="beta")
    a = queued(queue="alpha")
    ids = [j["id"] for j in viewer.get("/jobs").json()["results"]]
    assert ids == [str(a.pk), str(b.pk), str(c.pk)]

    def listed(**params):
        response = viewer.get("/jobs", **params)
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    assert listed(status="failed") == {str(b.pk)}
    assert listed(status="failed,succeeded") == {str(b.pk), str(c.pk)}
    assert listed(status=["queued", "succeeded"]) == {str(a.pk), str(c.pk)}
    assert listed(queue="alpha") == {str(a.pk), str(c.pk)}
    assert listed(queue="alpha", status="queued") == {str(a.pk)}
    assert listed(operation="ping") == {str(a.pk), str(b.pk), str(c.pk)}
    assert listed(operation="sleep") == set()
    assert listed(q="boom") == {str(b.pk)}  # error_message
    assert listed(q="Boom") == {str(b.pk)}  # error_code
    assert listed(q="pin") == {str(a.pk), str(b.pk), str(c.pk)}  # operation
    assert listed(q=str(a.pk)) == {str(a.pk)}  # whole id
    assert listed(q=str(a.pk)[:8]) >= {str(a.pk)}  # id prefix


def test_list_filters_by_parent_and_created_range(viewer):
    parent = queued()
    child = queued(parent=parent.pk)
    other = queued()
    Job.objects.filter(pk=other.pk).update(created_at=timezone.now() - timedelta(days=2))

    def listed(**params):
        response = viewer.get("/jobs", **params)
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    assert listed(parent=str(parent.pk)) == {str(child.pk)}
    assert listed(parent="none") == {str(parent.pk), str(other.pk)}
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert listed(created_before=yesterday) == {str(other.pk)}
    assert listed(created_after=yesterday) == {str(parent.pk), str(child.pk)}


@pytest.mark.parametrize(
    "params",
    [
        {"status": "bogus"},
        {"parent": "x"},
        {"created_after": "soon"},
        {"limit": "0"},
        {"limit": "many"},
        {"cursor": "garbage!"},
    ],
)
def test_list_refuses_bad_filters(viewer, params):
    error = assert_error_shape(viewer.get("/jobs", **params), 400)
    assert set(params) <= set(error["errors"]), error


def test_cursor_pagination_walks_every_job_once(viewer):
    now = timezone.now()
    jobs = [queued() for _ in range(7)]
    # Two pairs share created_at exactly: the id breaks the tie.
    Job.objects.filter(pk__in=[jobs[1].pk, jobs[2].pk]).update(created_at=now)
    earlier = now - timedelta(seconds=1)
    Job.objects.filter(pk__in=[jobs[4].pk, jobs[5].pk]).update(created_at=earlier)
    seen, url, pages = [], "/jobs?limit=2", 0
    while url:
        response = viewer.client.get(url, headers=viewer.headers)
        assert response.status_code == 200
        body = response.json()
        seen += [j["id"] for j in body["results"]]
        # Counted on the first page only: a cursor page skips the count.
        assert body["count"] == (7 if pages == 0 else None) and body["count_capped"] is False
        url, pages = body["next"], pages + 1
        assert url is None or url.startswith("http://testserver/jobs?")
    assert pages == 4
    assert sorted(seen) == sorted(str(j.pk) for j in jobs) and len(seen) == 7
    newest_first = Job.objects.order_by("-created_at", "-id").values_list("pk", flat=True)
    expected = [str(pk) for pk in newest_first]
    assert seen == expected


def test_count_is_capped(viewer, settings):
    settings.CONTROLPLANE = {"COUNT_CAP": 3}
    for _ in range(5):
        queued()
    body = viewer.get("/jobs", limit=2).json()
    assert body["count"] == 3 and body["count_capped"] is True
    body = viewer.get("/jobs", limit=2, status="running").json()
    assert body["count"] == 0 and body["count_capped"] is False


def test_cancel_a_queued_job_records_who_and_why(operator):
    job = queued()
    response = operator.post(f"/jobs/{job.pk}/cancel", {"reason": "not needed"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    event = fresh(job).events.order_by("-seq").first()
    assert event.event == "job.cancelled"
    assert event.fields == {"by": "operator", "reason": "not needed"}


def test_cancel_is_idempotent_and_a_noop_on_terminal_jobs(operator):
    job = queued()
    assert operator.post(f"/jobs/{job.pk}/cancel").json()["status"] == "cancelled"
    events = timeline(job)
    again = operator.post(f"/jobs/{job.pk}/cancel/")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    assert timeline(job) == events
    done = succeeded()
    response = operator.post(f"/jobs/{done.pk}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "succeeded"


def test_cancel_cascades_to_queued_and_running_children(operator):
    parent, _ = running()
    child_queued = queued(parent=parent.pk)
    child_running, _ = running(parent=parent.pk)
    child_done = succeeded(parent=parent.pk)
    assert operator.post(f"/jobs/{parent.pk}/cancel").status_code == 200
    assert fresh(child_queued).status == "cancelled"
    assert fresh(child_running).status == "cancelled"
    assert fresh(child_done).status == "succeeded"


@pytest.mark.parametrize("make", [failed, cancelled])
def test_retry_of_failed_or_cancelled(operator, make):
    job = make()
    response = operator.post(f"/jobs/{job.pk}/retry", {"reason": "try again"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued" and body["attempts"] == 0 and body["error_code"] == ""
    event = fresh(job).events.order_by("-seq").first()
    assert event.event == "job.retried" and event.fields["by"] == "operator"


@pytest.mark.parametrize("make", [queued, succeeded, lambda: running()[0]])
def test_retry_of_a_job_that_is_not_failed_or_cancelled_is_409(operator, make):
    job = make()
    before = timeline(job)
    assert_error_shape(operator.post(f"/jobs/{job.pk}/retry"), 409)
    assert timeline(job) == before


@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_cancel_and_retry_of_unknown_or_malformed_ids_are_404(operator, action):
    assert_error_shape(operator.post(f"/jobs/{uuid.uuid4()}/{action}"), 404)
    assert_error_shape(operator.post(f"/jobs/12345/{action}"), 404)


def test_reason_must_be_text(operator):
    job = queued()
    error = assert_error_shape(operator.post(f"/jobs/{job.pk}/cancel", {"reason": {"a": 1}}), 400)
    assert "reason" in error["errors"]
    assert fresh(job).status == "queued"
