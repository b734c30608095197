"""The worker WebSocket (/ws/workers/<id>): who may open it, and what it pushes."""

from __future__ import annotations

import json
import time

import pytest

from jobs.enqueue import enqueue

pytest.importorskip("websockets", reason="the client's push extra (websockets) is not installed")
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from .helpers import ECHO, OTHER, register

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


def next_available(ws, queue: str, timeout: float = 10.0) -> dict:
    """The next ``job.available`` for ``queue``. Hints for the worker's other queues may come
    first (the relay's periodic look, a NOTIFY of the previous test's jobs): a hint is only
    a reason to claim, and an extra one costs a claim that finds nothing."""
    deadline = time.monotonic() + timeout
    while True:
        message = next_message(ws, "job.available", max(0.01, deadline - time.monotonic()))
        if message["queue"] == queue:
            return message


def test_socket_pushes_job_available_for_the_workers_queues(api, server, token):
    worker = register(api, [ECHO, OTHER])
    with open_socket(server, worker["id"], token=token) as ws:
        hello = next_message(ws, "hello")
        assert set(hello["queues"]) == {"remote", "default"}
        # The socket's queues are subscribed before ``hello``: a job enqueued from now on
        # is announced (by NOTIFY, or by the SQLite relay's next look at the queues).
        enqueue("remote.echo", {"text": "x"})
        assert next_available(ws, "remote") == {"type": "job.available", "queue": "remote"}
        enqueue("remote.other", {})
        assert next_available(ws, "default")["queue"] == "default"
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


# --- Origin: browsers send one, non-browser clients with a token need not ---------------


def _stack():
    from django_controlplane.routing import controlplane_websockets

    return controlplane_websockets()


def _handshake(
    path: str, headers: list[tuple[bytes, bytes]], *, greeting: bool = True
) -> tuple[bool, dict | None]:
    """Open ``path`` on the validator-wrapped routing in-process; (accepted, first message)."""
    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator

    async def run() -> tuple[bool, dict | None]:
        communicator = WebsocketCommunicator(_stack(), path, headers=headers)
        connected, _ = await communicator.connect(timeout=10)
        first = await communicator.receive_json_from(timeout=10) if connected and greeting else None
        await communicator.disconnect()
        return connected, first

    return async_to_sync(run)()


def test_a_token_client_without_origin_is_accepted(api, server, token):
    worker = register(api)
    path = f"/ws/workers/{worker['id']}"
    header = [(b"authorization", f"Token {token}".encode())]
    assert _handshake(path, header) == (True, {"type": "hello", **_hello(worker)})
    assert _handshake(f"{path}?token={token}", [])[0]
    # A foreign Origin is refused even with a valid token; an allowed one passes.
    assert not _handshake(path, [*header, (b"origin", b"http://evil.example")])[0]
    assert _handshake(path, [*header, (b"origin", b"http://localhost")])[0]
    # No Origin and no token: refused before any consumer runs.
    assert not _handshake(path, [])[0]


def _hello(worker: dict) -> dict:
    return {"worker": worker["id"], "queues": worker["queues"]}


def test_without_origin_a_session_cookie_is_not_enough(api, server, token):
    """Cookie authentication keeps the Origin check: a handshake without Origin has its
    cookies dropped, so even a valid session plus a (bogus) token gets nowhere."""
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    user = User.objects.create_user("operator-ws")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_job", "change_job", "run_remote_jobs"])
    )
    browser = Client()
    browser.force_login(user)
    cookie = f"sessionid={browser.cookies['sessionid'].value}".encode()
    dashboard = [(b"cookie", cookie), (b"origin", b"http://localhost")]
    assert _handshake("/ws/dashboard/", dashboard, greeting=False)[
        0
    ]  # the browser case still works
    stripped = [(b"cookie", cookie), (b"authorization", b"Token not-a-token")]
    assert not _handshake("/ws/dashboard/", stripped, greeting=False)[0]


def test_the_server_accepts_a_token_client_without_origin(api, server, token):
    worker = register(api)
    url = server.url.replace("http://", "ws://") + f"/ws/workers/{worker['id']}"
    headers = {"Authorization": f"Token {token}"}
    with connect(url, additional_headers=headers, origin=None, proxy=None, open_timeout=5) as ws:
        assert next_message(ws, "hello")["worker"] == worker["id"]
