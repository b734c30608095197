"""The Python SDK's ``Client`` (clients/python: no Django, no database) against a live server:
``wait``, ``result`` (and its errors), ``start_workflow``, ``workflow(id, wait=)``, and waits
longer than one long-poll."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from django_controlplane.testing import drain_jobs
from jobs.transitions import cancel_job

from .test_long_poll import server, token  # noqa: F401 - fixtures: the live server, a token

CLIENT_SRC = Path(__file__).resolve().parents[3] / "clients" / "python"
sys.path.insert(0, str(CLIENT_SRC))

from controlplane_client import (  # noqa: E402
    ApiError,
    Client,
    JobFailedError,
    JobWasCancelledError,
    WaitTimeoutError,
)
from controlplane_client import client as client_module  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(server, token):  # noqa: F811
    with Client(server.url, token=token) as made:
        yield made


def later(seconds: float, call) -> threading.Thread:
    """Run ``call`` after ``seconds`` on a thread (closing the connection it opens there)."""
    from django.db import connection

    def run() -> None:
        time.sleep(seconds)
        try:
            call()
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_result_returns_a_succeeded_job_s_result(client):
    job = client.enqueue("ping")
    thread = later(0.5, drain_jobs)
    started = time.monotonic()
    assert client.result(job["id"], timeout=30) == {"pong": True}
    assert time.monotonic() - started < 10
    thread.join(10)


def test_result_raises_for_failed_and_cancelled_jobs(client):
    failing = client.enqueue("fail", {"message": "no luck"})
    later(0.3, drain_jobs).join(20)
    with pytest.raises(JobFailedError) as failed:
        client.result(failing["id"], timeout=10)
    assert failed.value.status == "failed" and "no luck" in str(failed.value)

    doomed = client.enqueue("ping")
    later(0.3, lambda: cancel_job(doomed["id"], reason="no"))
    with pytest.raises(JobWasCancelledError):
        client.result(doomed["id"], timeout=30)


def test_a_timeout_raises_with_the_state_then(client):
    job = client.enqueue("ping")
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError) as timed_out:
        client.wait(job["id"], timeout=1.0)
    assert 0.9 <= time.monotonic() - started < 5
    assert timed_out.value.state["status"] == "queued"


def test_a_wait_longer_than_one_long_poll_loops(client, monkeypatch):
    monkeypatch.setattr(client_module, "MAX_WAIT_SECONDS", 0.5)  # each long-poll 0.5 s at most
    job = client.enqueue("ping")
    thread = later(1.8, drain_jobs)
    assert client.wait(job["id"], timeout=30)["status"] == "succeeded"
    thread.join(10)


def test_start_a_workflow_and_wait_for_it(client):
    run = client.start_workflow(
        {
            "name": "sdk",
            "steps": [
                {"name": "a", "operation": "ping"},
                {"name": "b", "operation": "ping", "depends_on": ["a"]},
            ],
        }
    )
    assert run["status"] == "running" and [s["step"] for s in run["steps"]] == ["a", "b"]
    assert client.workflow(run["id"])["counts"]["queued"] == 2
    thread = later(0.5, drain_jobs)
    done = client.workflow(run["id"], wait=30)
    assert done["status"] == "succeeded" and done["result"] == {"pong": True}
    thread.join(10)
    waiting = client.start_workflow({"steps": [{"operation": "ping"}]})
    assert client.workflow(waiting["id"], wait=0.5)["status"] == "running"
    assert client.cancel_workflow(waiting["id"], reason="sdk")["status"] == "cancelled"


def test_a_refused_workflow_is_an_api_error_by_field(client):
    with pytest.raises(ApiError) as refused:
        client.start_workflow({"steps": [{"name": "a"}]})
    assert refused.value.status_code == 400
    assert "steps.0.operation" in refused.value.errors


def test_the_client_needs_no_django():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO", "DATABASE"))}
    env["PYTHONPATH"] = str(CLIENT_SRC)
    code = (
        "import sys, controlplane_client; "
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
