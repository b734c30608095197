"""The web process's threads and responder: order, refusals, and what reaches the client."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from django_controlplane.web.responder import BufferedResponse, respond, wsgi_environ
from django_controlplane.web.threads import Busy, WebThreads


class Recorder:
    """An ASGI ``send`` that keeps the messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)


class Streaming:
    """A response like Django's streaming ones: iterable, ``streaming``, closed once."""

    streaming = True

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = 0

    def __iter__(self):
        return iter(self.chunks)

    def close(self) -> None:
        self.closed += 1


SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/jobs",
    "query_string": b"a=1",
    "http_version": "1.1",
    "headers": [(b"content-type", b"application/json"), (b"x-one", b"1")],
    "server": ("127.0.0.1", 8000),
    "client": ("127.0.0.1", 5000),
}


def test_the_environ_carries_the_body_already_read():
    environ = wsgi_environ(SCOPE, b'{"operation": "ping"}')
    assert environ["REQUEST_METHOD"] == "POST" and environ["PATH_INFO"] == "/jobs"
    assert environ["QUERY_STRING"] == "a=1" and environ["CONTENT_TYPE"] == "application/json"
    assert environ["HTTP_X_ONE"] == "1"
    assert environ["wsgi.input"].read() == b'{"operation": "ping"}'


def test_a_plain_response_comes_back_whole_and_closed():
    closed = []

    class Plain(list):
        def close(self) -> None:
            closed.append(True)

    def app(environ, start_response):
        write = start_response("201 Created", [("Content-Type", "application/json")])
        write(b"[")
        return Plain([b"1", b"]"])

    async def scenario() -> tuple[Any, Recorder]:
        recorder = Recorder()
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(None, respond, app, {}, loop, recorder)
        return response, recorder

    response, recorder = asyncio.run(scenario())
    assert response == BufferedResponse(201, [(b"content-type", b"application/json")], b"[1]")
    assert recorder.messages == [] and closed == [True]

    recorder = Recorder()
    asyncio.run(response.send(recorder))
    assert [m["type"] for m in recorder.messages] == ["http.response.start", "http.response.body"]
    assert recorder.messages[0]["status"] == 201 and recorder.messages[1]["body"] == b"[1]"


def test_a_streaming_response_is_sent_chunk_by_chunk_from_the_thread():
    streamed = Streaming([b"ab", b"", b"cd"])

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "4")])
        return streamed

    async def scenario() -> tuple[Any, Recorder]:
        recorder = Recorder()
        loop = asyncio.get_running_loop()
        response = await loop.run_in_executor(None, respond, app, {}, loop, recorder)
        return response, recorder

    response, recorder = asyncio.run(scenario())
    assert response is None and streamed.closed == 1
    assert recorder.messages == [
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]},
        {"type": "http.response.body", "body": b"ab", "more_body": True},
        {"type": "http.response.body", "body": b"cd", "more_body": True},
        {"type": "http.response.body", "body": b""},
    ]


def test_calls_run_first_come_first_served():
    threads = WebThreads(1, queue_timeout=5, max_waiting=100)
    order: list[int] = []

    async def scenario() -> None:
        await asyncio.gather(*(threads.call(order.append, n) for n in range(50)))

    asyncio.run(scenario())
    assert order == list(range(50))


def test_a_call_no_thread_takes_in_time_is_busy_and_never_runs():
    threads = WebThreads(1, queue_timeout=0.05, max_waiting=100)
    release = threading.Event()
    ran: list[str] = []

    def hold() -> str:
        release.wait(5)
        time.sleep(0.1)  # still running when the queued call's timeout ends
        return "held"

    async def scenario() -> tuple[Any, Any]:
        holding = asyncio.ensure_future(threads.call(hold))
        await asyncio.sleep(0.01)
        queued = asyncio.ensure_future(threads.call(ran.append, "queued"))
        await asyncio.sleep(0.1)
        release.set()
        return await asyncio.gather(holding, queued, return_exceptions=True)

    held, queued = asyncio.run(scenario())
    assert held == "held"  # a call already running is waited for, whatever the timeout
    assert isinstance(queued, Busy)
    threads.executor.submit(lambda: None).result(5)  # the queue has been worked off
    assert ran == [] and threads.in_flight == 0


def test_past_the_waiting_limit_a_call_is_refused_at_once():
    threads = WebThreads(1, queue_timeout=5, max_waiting=2)
    release = threading.Event()

    async def scenario() -> list[Any]:
        calls = [asyncio.ensure_future(threads.call(release.wait, 5)) for _ in range(3)]
        await asyncio.sleep(0.01)
        with pytest.raises(Busy):
            await threads.call(release.wait, 5)
        release.set()
        return await asyncio.gather(*calls)

    assert asyncio.run(scenario()) == [True, True, True]


def test_async_view_steps_are_handed_over_one_per_thread_at_a_time():
    threads = WebThreads(1, queue_timeout=5, max_waiting=100)
    release = threading.Event()
    order: list[int] = []

    async def scenario() -> tuple[int, list[Any]]:
        request = asyncio.ensure_future(threads.call(release.wait, 5))  # holds the thread
        steps = [asyncio.ensure_future(threads.run(order.append, n)) for n in range(5)]
        await asyncio.sleep(0.05)
        queued = threads.in_flight  # the request, and one step: the other four wait on the loop
        release.set()
        await request
        return queued, await asyncio.gather(*steps)

    queued, results = asyncio.run(scenario())
    assert queued == 2
    assert results == [None] * 5 and order == list(range(5))


def test_only_the_long_polling_claim_and_waiting_reads_are_served_as_async_views():
    from django_controlplane.web.dispatch import (
        MAX_REMEMBERED_PATH,
        HttpDispatcher,
    )
    from django_controlplane.web.dispatch import (
        _route_kind as _resolves_to_async_view,
    )

    worker = "0339fc4f-5d09-429a-920b-99ab44f8aabf"
    is_async = HttpDispatcher.is_async_view
    for _ in range(2):  # the second time from what was remembered
        assert is_async({"path": f"/workers/{worker}/claim"})
        assert not is_async({"path": f"/jobs/{worker}/events"})
        assert not is_async({"path": "/no/such/page"})
        assert is_async({"path": f"/cp/workers/{worker}/claim", "root_path": "/cp"})
        # A job's read parks on the event loop only when asked to wait for its end.
        assert not is_async({"path": f"/jobs/{worker}", "query_string": b""})
        assert not is_async({"path": f"/jobs/{worker}", "query_string": b"waiting=1"})
        assert is_async({"path": f"/jobs/{worker}", "query_string": b"x=1&wait=5"})
    assert _resolves_to_async_view.cache_info().hits >= 4
    remembered = _resolves_to_async_view.cache_info().currsize
    assert not is_async({"path": "/x" * MAX_REMEMBERED_PATH})
    assert _resolves_to_async_view.cache_info().currsize == remembered


def test_a_step_that_never_gets_its_turn_is_busy_and_never_runs():
    threads = WebThreads(1, queue_timeout=0.05, max_waiting=1)
    release = threading.Event()
    ran: list[str] = []

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(threads.run(release.wait, 5))  # has the turn, runs
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(threads.run(ran.append, "late"))  # waits for the turn
        await asyncio.sleep(0.01)
        with pytest.raises(Busy):  # one already waits: max_waiting
            await threads.run(ran.append, "refused")
        results = await asyncio.gather(late, return_exceptions=True)
        release.set()
        return [await first, *results]

    first, late = asyncio.run(scenario())
    assert first is True and isinstance(late, Busy)
    threads.executor.submit(lambda: None).result(5)
    assert ran == [] and threads.paced_waiting == 0 and threads.in_flight == 0
