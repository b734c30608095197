"""Outcome signals sent by the web process: an operator's cancel, a remote complete or fail."""

from __future__ import annotations

import pytest

from jobs.models import Job
from tests import signal_app
from tests.factories import queued

from .conftest import claim_one, register_worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "signals.jsonl"
    signal_app.install(path)
    yield path
    signal_app.uninstall()


def _entries(path, job_id) -> list[dict]:
    return [e for e in signal_app.read(path) if e.get("job_id") == str(job_id)]


def test_an_operator_cancel_through_the_api_is_sent_once(operator, log):
    job = queued()
    response = operator.post(f"/jobs/{job.pk}/cancel", {"reason": "not needed"})
    assert response.status_code == 200, response.content
    assert operator.post(f"/jobs/{job.pk}/cancel").status_code == 200  # a no-op the second time
    [entry] = _entries(log, job.pk)
    assert (entry["kind"], entry["by"], entry["stored"]) == (
        "job_cancelled",
        "operator",
        "cancelled",
    )


def test_a_remote_workers_complete_and_fail_are_sent_by_the_web_process(api_for, log):
    remote = api_for("remote")
    worker_id = register_worker(remote)
    done, token = claim_one(remote, worker_id)
    response = remote.post(f"/jobs/{done}/complete", {"lease_token": token, "result": {"ok": 1}})
    assert response.status_code == 200, response.content
    failed, token = claim_one(remote, worker_id)
    response = remote.post(
        f"/jobs/{failed}/fail",
        {"lease_token": token, "error_code": "Broken", "error_message": "it broke"},
    )
    assert response.status_code == 200, response.content
    [entry] = _entries(log, done)
    assert (entry["kind"], entry["result"], entry["stored"]) == (
        "job_succeeded",
        {"ok": 1},
        "succeeded",
    )
    assert entry["attempt"] == 1 and entry["operation"] == "ping"
    [entry] = _entries(log, failed)
    assert (entry["kind"], entry["error_code"]) == ("job_failed", "Broken")
    assert Job.objects.get(pk=failed).status == "failed"
    # A stale complete (the job is terminal) changes nothing and sends nothing.
    again = remote.post(f"/jobs/{done}/complete", {"lease_token": token, "result": None})
    assert again.status_code == 409
    assert len(_entries(log, done)) == 1
