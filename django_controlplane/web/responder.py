"""Django's WSGI handler run on a web thread, its response sent by the event loop.

Before, a2wsgi's responder bridged the two: it handed the loop each part of a
response (the start, every chunk, the end) and blocked the thread until the
loop had taken it. That is three waits per request, each for a loop busy with
other clients' requests, and with one web thread per process they were the
thread's idle time: requests queued behind it, and the events poll at 32
clients had a p99 that swung between 45 and 600 ms.

Here the thread runs the request to the end and returns the whole response;
the loop sends it while the thread already runs the next request. Only a
streaming response (WhiteNoise's files) is still sent piece by piece from the
thread, as it is read.
"""

from __future__ import annotations

import asyncio
import io
import itertools
from dataclasses import dataclass
from typing import Any, cast

from a2wsgi.wsgi import build_environ

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class BufferedResponse:
    status: int
    headers: Headers
    body: bytes

    async def send(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def wsgi_environ(scope: dict[str, Any], body: bytes) -> dict[str, Any]:
    """The WSGI environ of an HTTP scope whose body has already been read in full."""
    return cast(dict[str, Any], build_environ(scope, io.BytesIO(body)))  # type: ignore[arg-type]


def respond(
    app: Any, environ: dict[str, Any], loop: asyncio.AbstractEventLoop, send: Any
) -> BufferedResponse | None:
    """Run the WSGI ``app`` on this (web) thread.

    Returns the whole response for the loop to send, or ``None`` when the
    response was streaming and has already been sent from here. Either way
    the response is closed before this returns, which fires Django's
    ``request_finished`` and gives the thread's connection back to the pool.
    """
    started: list[tuple[int, Headers]] = []
    written: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        code = int(status.split(" ", 1)[0])
        encoded = [
            (name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
            for name, value in headers
        ]
        started[:] = [(code, encoded)]
        return written.append

    response = app(environ, start_response)
    try:
        if not getattr(response, "streaming", False):
            body = b"".join([*written, *response])
            status, headers = started[0]
            return BufferedResponse(status, headers, body)

        def send_now(message: dict[str, Any]) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        status, headers = started[0]
        send_now({"type": "http.response.start", "status": status, "headers": headers})
        for chunk in itertools.chain(written, response):
            if chunk:
                send_now({"type": "http.response.body", "body": chunk, "more_body": True})
        send_now({"type": "http.response.body", "body": b""})
        return None
    finally:
        close = getattr(response, "close", None)
        if close is not None:
            close()
