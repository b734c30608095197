"""``django_controlplane.web.head_timeout`` on both of uvicorn's HTTP/1.1 parsers
(``manage.py serve``
uses httptools when installed, as uvicorn's "auto" does; h11 otherwise): a real uvicorn
server on a loopback socket, in a thread, with a one-line ASGI app."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from django_controlplane.web.head_timeout import RECEIVED_AT, head_timeout_protocol

from .test_serve_client_limits import closed_by_server, read_response

HEAD_TIMEOUT = 0.5


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=["httptools", "h11"])
def address(request) -> Iterator[tuple[str, int]]:
    if request.param == "httptools":
        pytest.importorskip("httptools")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=head_timeout_protocol(HEAD_TIMEOUT, http=request.param),
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=5,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


HEAD = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


def test_an_idle_connection_is_closed(address):
    with socket.create_connection(address) as sock:
        took = closed_by_server(sock, HEAD_TIMEOUT + 2)
    assert took is not None and took >= HEAD_TIMEOUT * 0.8, took


def test_a_trickled_head_is_closed_on_the_first_and_on_a_kept_alive_request(address):
    for requests_before in (0, 1):
        with socket.create_connection(address) as sock:
            for _ in range(requests_before):
                sock.sendall(HEAD)
                assert read_response(sock)[0] == 200
            started = time.monotonic()
            closed = None
            for byte in b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 100:
                try:
                    sock.send(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed = time.monotonic() - started
                    break
                if closed_by_server(sock, 0.1) is not None:
                    closed = time.monotonic() - started
                    break
            assert closed is not None and closed < HEAD_TIMEOUT + 2, (requests_before, closed)


def test_requests_on_time_keep_alive_and_slow_bodies_are_served(address):
    with socket.create_connection(address) as sock:
        sock.sendall(HEAD)
        assert read_response(sock)[0] == 200
        time.sleep(HEAD_TIMEOUT * 2)  # idle between requests: keep-alive's business
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n")
        time.sleep(HEAD_TIMEOUT * 2)  # the body late: not under the head's deadline
        sock.sendall(b"{}")
        assert read_response(sock)[0] == 200


arrivals: list[tuple[float | None, float]] = []


async def stamping_app(scope, receive, send) -> None:
    """Records when the protocol says the request arrived, and when the app first ran."""
    if scope["type"] != "http":
        return
    arrivals.append((scope.get(RECEIVED_AT), asyncio.get_running_loop().time()))
    await app(scope, receive, send)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_request_is_stamped_with_the_time_its_head_began_to_arrive(http: str) -> None:
    """Long-polls count their wait from ``RECEIVED_AT``: the head's first byte, not the
    moment the app got its first turn on the loop (late when a thousand arrive at once)."""
    if http == "httptools":
        pytest.importorskip("httptools")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            stamping_app,
            http=head_timeout_protocol(5, http=http),
            lifespan="off",
            log_level="warning",
        )
    )
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        arrivals.clear()
        with socket.create_connection(sock.getsockname(), timeout=5) as client:
            client.sendall(b"GET / HTTP/1.1\r\n")
            time.sleep(0.3)
            client.sendall(b"Host: x\r\n\r\n")
            assert read_response(client)[0] == 200
            client.sendall(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive: its own
            assert read_response(client)[0] == 200
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    (first_at, first_ran), (second_at, second_ran) = arrivals
    assert first_at is not None and second_at is not None
    assert first_ran - first_at >= 0.25  # stamped at the first byte, before the pause
    assert 0 <= second_ran - second_at < 0.25 and second_at > first_ran
