"""``manage.py serve`` drops clients that hold a connection without sending a request
(idle, or a head trickled byte by byte), while normal requests, keep-alive and slow
bodies are untouched; a WebSocket message over ``MAX_WEBSOCKET_MESSAGE_BYTES`` closes
its socket with 1009."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import pytest

from tests.integration.remote.helpers import ECHO

HEAD_TIMEOUT = 1.0
KEEP_ALIVE = 3.0
LIMITS = {
    "CONTROLPLANE_HTTP_HEADER_TIMEOUT_SECONDS": str(HEAD_TIMEOUT),
    "CONTROLPLANE_HTTP_KEEP_ALIVE_SECONDS": str(KEEP_ALIVE),
}
SLACK = 2.5  # the server's timer and this machine's scheduling, on a busy 2-core box


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closed ``sock`` (EOF or reset), or None if it did not
    within ``within`` seconds. Anything the server sends before closing is read and dropped."""
    started = time.monotonic()
    deadline = started + within
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            continue
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a ``Content-Length`` from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a response body"
        body += chunk
    return status, headers, body


def request_head(url: str, method: str = "GET", path: str = "/workers", extra: str = "") -> bytes:
    host = urlsplit(url).netloc
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


def test_idle_and_slowloris_connections_are_closed_within_the_header_timeout(serve):
    served = serve(processes=1, threads=1, env=LIMITS)

    # (a) Connects and sends nothing.
    idle = connect(served.url)
    took = closed_by_server(idle, HEAD_TIMEOUT + SLACK)
    idle.close()
    assert took is not None, "an idle connection was still open well past the header timeout"
    assert took >= HEAD_TIMEOUT * 0.8, took

    # (b) Sends a request head one byte every 0.3 s: each byte is on time, the head is not.
    slow = connect(served.url)
    head = request_head(served.url, extra="X-Slow: " + "a" * 200 + "\r\n")
    started = time.monotonic()
    sent = 0
    closed_after = None
    while time.monotonic() - started < HEAD_TIMEOUT + SLACK:
        try:
            slow.send(head[sent : sent + 1])
            sent += 1
        except (BrokenPipeError, ConnectionResetError):
            closed_after = time.monotonic() - started
            break
        if closed_by_server(slow, 0.3) is not None:
            closed_after = time.monotonic() - started
            break
    slow.close()
    assert closed_after is not None, f"a slowloris head ({sent} bytes) was still being read"
    assert sent >= 3, sent  # the bytes kept coming, and the deadline did not move with them


def test_normal_requests_keep_alive_and_slow_bodies_still_work(serve):
    served = serve(processes=1, threads=1, env=LIMITS)
    sock = connect(served.url)
    try:
        sock.sendall(request_head(served.url))
        assert read_response(sock)[0] == 401
        # Idle between requests longer than the header timeout: keep-alive governs, not it.
        time.sleep(HEAD_TIMEOUT + 0.5)
        sock.sendall(request_head(served.url))
        status, headers, _ = read_response(sock)
        assert status == 401 and headers.get("connection", "").lower() != "close", headers
        # The head on time and the body later than the header timeout: answered.
        body = json.dumps({"operation": "ping"}).encode()
        sock.sendall(
            request_head(
                served.url,
                "POST",
                "/jobs",
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n",
            )
        )
        time.sleep(HEAD_TIMEOUT + 0.5)
        sock.sendall(body)
        assert read_response(sock)[0] == 401  # anonymous: the body was read, then refused
        # Then idle past HTTP_KEEP_ALIVE_SECONDS: closed.
        took = closed_by_server(sock, KEEP_ALIVE + SLACK)
        assert took is not None and took >= KEEP_ALIVE * 0.8, took
    finally:
        sock.close()


def test_websocket_messages_over_the_cap_close_the_socket_with_1009(serve, make_token):
    pytest.importorskip(
        "websockets", reason="the client's push extra (websockets) is not installed"
    )
    import httpx
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect as ws_connect

    from jobs.conf import DEFAULTS

    cap = DEFAULTS["MAX_WEBSOCKET_MESSAGE_BYTES"]  # the default, as deployed
    served = serve(processes=1, threads=1)
    token = make_token("ws")
    worker = httpx.post(
        served.url + "/workers",
        json={"name": "t", "operations": [ECHO]},
        headers={"Authorization": f"Token {token}"},
        trust_env=False,
    )
    assert worker.status_code == 201, worker.text
    url = served.url.replace("http://", "ws://") + f"/ws/workers/{worker.json()['id']}"
    url += f"?token={token}"

    def pong(ws, message: dict) -> None:
        ws.send(json.dumps(message))
        deadline = time.monotonic() + 10
        while json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))["type"] != "pong":
            pass

    with ws_connect(url, proxy=None, open_timeout=10, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "hello"
        pong(ws, {"type": "ping"})
        # As large as the dashboard's largest subscription (500 row ids), with room to spare.
        pong(ws, {"type": "ping", "pad": "x" * 30_000})
        ws.send(json.dumps({"type": "ping", "pad": "x" * cap}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value
