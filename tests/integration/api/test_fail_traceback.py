"""A remote worker's ``POST /jobs/<id>/fail`` may carry a traceback, kept bounded as a local one."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.failures import MAX_TRACEBACK_BYTES, fingerprint
from jobs.models import Job, JobEvent

from .conftest import assert_error_shape, claim_one, register_worker

REMOTE_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/home/worker/app/serve.py", line 40, in run\n'
    "    handler(job)\n"
    '  File "/home/worker/app/thumbs.py", line 12, in resize\n'
    "    raise OSError('image 7 is <corrupt>')\n"
    "OSError: image 7 is <corrupt>\n"
)


def failure_event(job_id: str) -> JobEvent:
    return JobEvent.objects.filter(
        job_id=job_id, event__in=["job.failed", "job.retry_scheduled"]
    ).get()


def fail(api, job_id: str, token: str, **body):
    return api.post(
        f"/jobs/{job_id}/fail",
        {"lease_token": token, "error_code": "OSError", "error_message": "image 7", **body},
    )


def test_a_remote_traceback_is_stored_with_its_fingerprint(admin):
    job_id, token = claim_one(admin, register_worker(admin))
    response = fail(admin, job_id, token, traceback=REMOTE_TRACEBACK)
    assert response.status_code == 200 and response.json() == {"id": job_id, "status": "failed"}
    event = failure_event(job_id)
    assert event.fields["traceback"] == REMOTE_TRACEBACK  # whitespace and all
    # The innermost frame is read from the text: the remote worker's ``resize``.
    assert event.fields["fingerprint"] == fingerprint("OSError", "image 7", "thumbs.py:resize")
    assert Job.objects.get(pk=job_id).error_code == "OSError"


def test_a_retried_remote_failure_keeps_its_traceback_too(admin):
    worker_id = register_worker(admin)
    job = enqueue("ping", max_attempts=2)
    [held] = admin.post(f"/workers/{worker_id}/claim", {"limit": 1}).json()["jobs"]
    job_id, token = str(job.pk), held["lease_token"]
    assert held["id"] == job_id
    response = fail(admin, job_id, token, traceback=REMOTE_TRACEBACK, retryable=True)
    assert response.json()["status"] == "queued"
    assert failure_event(job_id).fields["traceback"] == REMOTE_TRACEBACK


def test_a_long_remote_traceback_is_bounded_keeping_its_end(admin):
    job_id, token = claim_one(admin, register_worker(admin))
    long = "Traceback (most recent call last):\n" + "  frame\n" * 20_000 + "OSError: last\n"
    assert fail(admin, job_id, token, traceback=long).status_code == 200
    stored = failure_event(job_id).fields["traceback"]
    assert len(stored.encode()) <= MAX_TRACEBACK_BYTES
    assert stored.startswith("Traceback") and stored.endswith("OSError: last\n")
    assert "bytes of traceback omitted" in stored


@pytest.mark.parametrize("body", [{}, {"traceback": ""}, {"traceback": None}])
def test_the_traceback_is_optional(admin, body):
    job_id, token = claim_one(admin, register_worker(admin))
    assert fail(admin, job_id, token, **body).status_code == 200
    fields = failure_event(job_id).fields
    assert "traceback" not in fields
    assert fields["fingerprint"] == fingerprint("OSError", "image 7")


@pytest.mark.parametrize("bad", ["a\x00b", "lone \ud800 surrogate"])
def test_an_unstorable_traceback_is_a_400_and_the_job_stays_running(admin, bad):
    job_id, token = claim_one(admin, register_worker(admin))
    before = Job.objects.values_list("status", "last_event_seq").get(pk=job_id)
    error = assert_error_shape(fail(admin, job_id, token, traceback=bad), 400)
    assert "traceback" in error["errors"], error
    assert Job.objects.values_list("status", "last_event_seq").get(pk=job_id) == before
    assert fail(admin, job_id, token, traceback="fine").json()["status"] == "failed"
