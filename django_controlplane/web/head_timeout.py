"""A deadline for each request head, which uvicorn does not have.

uvicorn (0.54, with httptools and with h11 alike) arms one timer per connection:
``timeout_keep_alive``, after a response, cancelled by the next byte. Before the
first request there is none, and none once a later request has begun. So a
client that connects and sends nothing, or sends its request head a byte at a
time (slowloris), holds the connection, its file descriptor and its buffers for
as long as it likes: 4,000 of them were held 20 s and more.

The protocols here add that deadline, ``HTTP_HEADER_TIMEOUT_SECONDS``: a timer
starts when the connection is made, and when the first byte of a later request
arrives, and stops once the request head is complete (a WebSocket handshake's
too). When it fires, the connection is closed without an answer. The body and
the response are not under it; idle time between requests stays uvicorn's
``timeout_keep_alive`` (``HTTP_KEEP_ALIVE_SECONDS``).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# Scope key: the event loop's time when the request's head began to arrive. Stamped here,
# where the bytes are read, because the ASGI app's first step can come much later: a
# thousand requests read in one pass of the loop start their apps one after another, and
# while the web threads hold the GIL each of those steps waits for it. Long-polls count
# their wait from this (``django_controlplane.web.dispatch``).
RECEIVED_AT = "controlplane.received_at"


class _HeadDeadline:
    """The timer. ``head_timeout`` is set per server by ``head_timeout_protocol``."""

    head_timeout: float = 10.0
    _head_timer: asyncio.TimerHandle | None = None
    # Set by the uvicorn protocol this is mixed into.
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _arm_head_timer(self) -> None:
        if self._head_timer is None and self.head_timeout > 0:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


class H11HeadTimeout(_HeadDeadline, H11Protocol):
    """h11: a head is pending while the client's side of the connection is ``IDLE``."""

    _head_began: float | None = None  # the loop's time at the first byte of a pending head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        waiting_for_head = self.conn.their_state is h11.IDLE
        if waiting_for_head and self._head_began is None:
            self._head_began = self.loop.time()
        super().data_received(data)
        scope = getattr(self, "scope", None)
        if scope is not None and RECEIVED_AT not in scope and self._head_began is not None:
            scope[RECEIVED_AT] = self._head_began  # h11 made this request's scope just now
            self._head_began = None
        if (
            waiting_for_head
            and self.conn.their_state is h11.IDLE
            and not self.transport.is_closing()
        ):
            self._arm_head_timer()  # part of a head: the clock runs from its first byte
        else:
            self._disarm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


def _httptools_protocol() -> type[asyncio.Protocol] | None:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn's "auto" picks h11
        return None

    class HttpToolsHeadTimeout(_HeadDeadline, HttpToolsProtocol):
        """httptools: a head runs from ``on_message_begin`` (its first byte) to
        ``on_headers_complete``. A head begun while an earlier response is still
        being written (pipelining) is left to the keep-alive timer that follows it."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[RECEIVED_AT] = self.loop.time()  # type: ignore[typeddict-unknown-key]
            if self.cycle is None or self.cycle.response_complete:
                self._arm_head_timer()

        def on_headers_complete(self) -> None:
            self._disarm_head_timer()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

    return HttpToolsHeadTimeout


def head_timeout_protocol(seconds: float, *, http: str = "auto") -> type[asyncio.Protocol]:
    """The HTTP protocol class for ``uvicorn.Config(http=...)``: uvicorn's own
    (httptools when installed, as its ``"auto"`` chooses, else h11) with a
    ``seconds`` deadline on each request head; ``0`` means none."""
    base: type[asyncio.Protocol] | None = None
    if http in ("auto", "httptools"):
        base = _httptools_protocol()
        if base is None and http == "httptools":
            raise ImportError("http='httptools' needs httptools installed")
    if base is None:
        base = H11HeadTimeout
    return type(base.__name__, (base,), {"head_timeout": float(seconds)})
