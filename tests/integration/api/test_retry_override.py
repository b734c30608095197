"""``POST /jobs`` ``retry``: a job's own retry policy, checked and stored, on both databases."""

from __future__ import annotations

import pytest

from jobs.models import Job

pytestmark = pytest.mark.django_db


def test_a_valid_retry_override_is_stored_on_the_job(operator):
    body = {
        "operation": "ping",
        "retry": {
            "backoff_seconds": 5,
            "backoff_max_seconds": 60,
            "jitter": 0,
            "strategy": "linear",
        },
    }
    response = operator.post("/jobs", body)
    assert response.status_code == 201, response.content
    stored = Job.objects.values_list("retry_policy", flat=True).get(pk=response.json()["id"])
    assert stored == {
        "backoff_seconds": 5.0,
        "backoff_max_seconds": 60.0,
        "jitter": 0.0,
        "strategy": "linear",
    }
    job_id = response.json()["id"]
    # The job's JSON shows it, in the answer, the job and the list, with its snooze count.
    listed = operator.get("/jobs").json()["results"]
    for shown in (response.json(), operator.get(f"/jobs/{job_id}").json(), listed[0]):
        assert shown["id"] == job_id
        assert (shown["retry_policy"], shown["retry_laters"]) == (stored, 0)


def test_without_retry_nothing_is_stored(operator):
    response = operator.post("/jobs", {"operation": "ping", "retry": None})
    assert response.status_code == 201, response.content
    assert Job.objects.values_list("retry_policy", flat=True).get(pk=response.json()["id"]) is None
    assert response.json()["retry_policy"] is None


@pytest.mark.parametrize(
    ("retry", "field", "words"),
    [
        ({"jitter": 2}, "retry.jitter", "fraction from 0 to 1"),
        ({"backoff_seconds": -1}, "retry.backoff_seconds", "from 0"),
        ({"strategy": "random"}, "retry.strategy", "exponential, linear, constant"),
        ({"max_retry_later": "ten"}, "retry.max_retry_later", "whole number"),
        ({"retry_on": ["ValueError"]}, "retry.retry_on", "declared on the operation"),
        ({"backoff": 1}, "retry.backoff", "not one of them"),
        ("fast", "retry", "must be an object"),
    ],
)
def test_a_bad_retry_override_is_a_400_naming_the_field(operator, retry, field, words):
    before = Job.objects.count()
    response = operator.post("/jobs", {"operation": "ping", "retry": retry})
    assert response.status_code == 400, response.content
    answer = response.json()
    assert set(answer) == {"message", "errors"}
    assert field in answer["errors"], answer
    assert words in answer["errors"][field][0]
    assert Job.objects.count() == before


@pytest.mark.parametrize(
    "raw",
    [
        '{"operation": "ping", "retry": {"backoff_seconds": 1e400}}',  # inf
        '{"operation": "ping", "retry": {"strategy": "linear\\u0000"}}',  # NUL
        '{"operation": "ping", "retry": {"strategy": "\\ud800"}}',  # a lone surrogate
        '{"operation": "ping", "retry": {"max_retry_later": 1' + "0" * 400 + "}}",
        '{"operation": "ping", "retry": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_hostile_retry_overrides_are_a_4xx_and_store_nothing(operator, raw):
    before = Job.objects.count()
    response = operator.post("/jobs", raw=raw)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert set(response.json()) == {"message", "errors"}
    assert Job.objects.count() == before


def test_a_remote_retryable_failure_backs_off_by_the_jobs_override(admin):
    from django.test import override_settings

    from jobs.enqueue import enqueue
    from jobs.models import JobEvent

    from .conftest import register_worker

    worker_id = register_worker(admin)
    job = enqueue(
        "ping",
        max_attempts=2,
        retry={"backoff_seconds": 600, "jitter": 0, "strategy": "constant"},
    )
    [held] = admin.post(f"/workers/{worker_id}/claim", {"limit": 1}).json()["jobs"]
    assert held["id"] == str(job.pk)
    with override_settings(CONTROLPLANE={"RETRY_BACKOFF_SECONDS": 1}):
        response = admin.post(
            f"/jobs/{job.pk}/fail",
            {
                "lease_token": held["lease_token"],
                "error_code": "Busy",
                "error_message": "busy",
                "retryable": True,
            },
        )
    assert response.json()["status"] == "queued"
    event = JobEvent.objects.get(job_id=job.pk, event="job.retry_scheduled")
    assert event.fields["delay_seconds"] == 600  # the knobs alone: at most 1 s
    job.refresh_from_db()
    assert 599 <= (job.run_after - event.ts).total_seconds() <= 601
