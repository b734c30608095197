"""The worker WebSocket (/ws/workers/<id>): who may open it, and what it pushes."""

from __future__ import annotations

import json
import time

import pytest

from jobs.enqueue import enqueue

pytest.importorskip("websockets", reason="the client's push extra (websockets) is not installed")
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from .helpers import ECHO, register

pytestmark = pytest.mark.django_db(transaction=True)


def open_socket(server, worker_id: str, *, token: str | None = None, header: str | None = None):
    url = server.url.replace("http://", "ws://") + f"/ws/workers/{worker_id}"
    if token:
        url += f"?token={token}"
    headers = {"Authorization": f"Token {header}"} if header else None
    return connect(url, additional_headers=headers, origin=server.url, proxy=None, open_timeout=5)


def next_message(ws, kind: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message["type"] == kind:
            return message


def test_socket_pushes_job_available_for_the_workers_queues(api, server, token):
    worker = register(api, [ECHO, "ping"])
    with open_socket(server, worker["id"], token=token) as ws:
        hello = next_message(ws, "hello")
        assert set(hello["queues"]) == {"remote", "default"}
        time.sleep(0.3)  # let a polling relay take its first look
        enqueue("remote.echo", {"text": "x"})
        assert next_message(ws, "job.available") == {"type": "job.available", "queue": "remote"}
        enqueue("ping", queue="default")
        assert next_message(ws, "job.available")["queue"] == "default"
        ws.send(json.dumps({"type": "ping"}))
        next_message(ws, "pong")


def test_socket_accepts_the_token_in_a_header(api, server, token):
    worker = register(api)
    with open_socket(server, worker["id"], header=token) as ws:
        assert next_message(ws, "hello")["worker"] == worker["id"]


def test_socket_refuses_strangers(api, server, make_token):
    worker = register(api)
    refused = [
        {},  # no credentials
        {"token": "not-a-token"},
        {"token": make_token("viewer", remote=False)},  # no run_remote_jobs
        {"token": make_token("other")},  # another user's worker
    ]
    for credentials in refused:
        with pytest.raises(InvalidStatus) as error:
            open_socket(server, worker["id"], **credentials).close()
        assert error.value.response.status_code == 403, credentials
