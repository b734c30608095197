"""``POST /jobs`` with ``unique_key``/``unique_while`` and ``timeout_seconds``, and what the job
JSON shows of them. PostgreSQL and SQLite."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs.models import Job
from tests.factories import claim, fresh
from tests.factories import failed as failed_job

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def post(api, **body):
    return api.post("/jobs", {"operation": "ping", **body})


def test_a_new_key_is_201_and_a_repeat_200_with_the_same_job(operator):
    first = post(operator, unique_key="sync-42", unique_while="queued")
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["duplicate"] is False
    assert (body["unique_key"], body["unique_while"], body["idempotency_key"]) == (
        "sync-42",
        "queued",
        None,
    )
    again = post(operator, unique_key="sync-42", unique_while="queued", priority=5)
    assert again.status_code == 200, again.content
    assert again.json()["duplicate"] is True
    assert again.json()["id"] == body["id"] and again.json()["priority"] == 0
    [job] = assert_enqueued("ping", count=1)
    assert (str(job.pk), job.unique_key, job.priority) == (body["id"], "sync-42", 0)


def test_without_a_key_every_post_is_a_new_job(operator):
    answers = [post(operator) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201]
    assert [a.json()["duplicate"] for a in answers] == [False, False]
    assert answers[0].json()["unique_key"] is None and answers[0].json()["unique_while"] is None
    stored = assert_enqueued("ping", count=2)
    assert {str(j.pk) for j in stored} == {a.json()["id"] for a in answers}


def test_the_key_is_free_again_once_the_holder_ended(operator):
    first = post(operator, unique_key="daily")
    assert first.json()["unique_while"] == "active"  # the default
    job = Job.objects.get(pk=first.json()["id"])
    assert post(operator, unique_key="daily").status_code == 200
    claim(job)
    assert post(operator, unique_key="daily").status_code == 200  # running still holds it
    operator.post(f"/jobs/{job.pk}/cancel")
    later = post(operator, unique_key="daily")
    assert later.status_code == 201 and later.json()["id"] != str(job.pk)


def test_idempotency_key_is_still_accepted_and_shown(operator, viewer):
    first = post(operator, idempotency_key="order-7")
    assert first.status_code == 201
    body = first.json()
    assert (body["idempotency_key"], body["unique_key"], body["unique_while"]) == (
        "order-7",
        "order-7",
        "until_retention",
    )
    # The two names are one key.
    again = post(operator, unique_key="order-7", unique_while="until_retention")
    assert (again.status_code, again.json()["id"]) == (200, body["id"])
    shown = viewer.get(f"/jobs/{body['id']}").json()
    assert (shown["idempotency_key"], shown["unique_while"]) == ("order-7", "until_retention")


def test_timeout_seconds_is_stored_and_shown(operator, viewer):
    created = post(operator, timeout_seconds=90)
    assert created.status_code == 201 and created.json()["timeout_seconds"] == 90.0
    assert fresh(created.json()["id"]).timeout_seconds == 90.0
    assert viewer.get(f"/jobs/{created.json()['id']}").json()["timeout_seconds"] == 90.0
    assert post(operator).json()["timeout_seconds"] is None
    listed = viewer.get("/jobs").json()["results"]
    assert {j["timeout_seconds"] for j in listed} == {90.0, None}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"unique_key": "k", "unique_while": "forever"}, "unique_while"),
        ({"unique_while": "active"}, "unique_while"),
        ({"unique_key": "k", "idempotency_key": "k"}, "idempotency_key"),
        ({"idempotency_key": "k", "unique_while": "queued"}, "unique_while"),
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": "k" * 256}, "unique_key"),
        ({"unique_key": "k\u0000"}, "unique_key"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"timeout_seconds": -5}, "timeout_seconds"),
        ({"timeout_seconds": True}, "timeout_seconds"),
        ({"timeout_seconds": "soon"}, "timeout_seconds"),
        ({"timeout_seconds": 1e300}, "timeout_seconds"),
        ({"timeout_seconds": 30 * 24 * 3600 + 1}, "timeout_seconds"),
    ],
)
def test_bad_keys_modes_and_timeouts_are_400_in_the_error_shape(operator, body, field):
    error = assert_error_shape(post(operator, **body), 400)
    assert field in error["errors"], error
    refute_enqueued()


def test_a_retry_while_another_job_holds_the_key_is_409(operator):
    old = failed_job(unique_key="export", unique_while="active")
    holder = post(operator, unique_key="export")
    assert holder.status_code == 201
    error = assert_error_shape(operator.post(f"/jobs/{old.pk}/retry"), 409)
    assert holder.json()["id"] in error["message"]
    assert fresh(old).status == "failed"


def test_the_schema_describes_the_new_fields(viewer):
    doc = viewer.get("/schema").json()
    schemas = doc["components"]["schemas"]
    enqueue = doc["paths"]["/jobs"]["post"]
    request = enqueue["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    fields = schemas[request.rsplit("/", 1)[1]]["properties"]
    assert {"unique_key", "unique_while", "timeout_seconds", "idempotency_key"} <= set(fields)
    for code in ("200", "201"):
        answer = enqueue["responses"][code]["content"]["application/json"]["schema"]["$ref"]
        shown = schemas[answer.rsplit("/", 1)[1]]["properties"]
        assert {"duplicate", "unique_key", "unique_while", "timeout_seconds"} <= set(shown)


@pytest.mark.django_db(transaction=True)
def test_concurrent_posts_of_one_key_get_one_201(api_for):
    operator = api_for("operator")
    clients = 6
    start = threading.Barrier(clients)
    answers: list[tuple[int, str, bool]] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            client = Client()
            start.wait(timeout=20)
            response = client.post(
                "/jobs",
                {"operation": "ping", "unique_key": "together", "unique_while": "active"},
                content_type="application/json",
                headers=operator.headers,
            )
            body = response.json()
            answers.append((response.status_code, body.get("id", ""), body.get("duplicate")))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sorted((code, duplicate) for code, _, duplicate in answers) == [(200, True)] * (
        clients - 1
    ) + [(201, False)], answers
    assert len({job_id for _, job_id, _ in answers}) == 1
    assert Job.objects.filter(unique_key="together").count() == 1
