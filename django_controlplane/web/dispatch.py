"""The ASGI application for HTTP requests of a web process.

Why not Django's ASGI handler for everything: it runs a sync view (all of DRF)
and each sync middleware on a thread made for that request, hopping between
the event loop and that thread several times per request. Here that cost was
4-6x against WSGI, and each new thread opened its own database connection.

So each request goes one of two ways, decided by the view its path resolves to:

* **async views** (the long-polling claim, and a read asked to ``?wait=``
  for an end: a sync view with a ``parks`` async twin,
  ``django_controlplane.api.long_poll``) go to Django's ASGI handler
  without the middleware stack (``AsyncViewHandler``) and wait on the event
  loop, holding no thread and no connection; their blocking steps run on the
  web threads (``django_controlplane.web.threads.WebThreads.run``);
* **every other view** runs through Django's WSGI handler on the process's
  fixed web threads (``django_controlplane.web.responder``): one hop there and one back per
  request, at most ``WEB_THREADS`` at once, first come first served, a 503
  with ``Retry-After`` when none takes the request in time.

Before either, the body is read here in full, up to
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (413 past it). A body sent with
``Transfer-Encoding: chunked`` has no ``Content-Length``, which Django reads
as an empty body; the request is passed on with the length it really had.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.urls import Resolver404, URLResolver, get_resolver

from django_controlplane.web.head_timeout import RECEIVED_AT
from django_controlplane.web.overload import send_busy
from django_controlplane.web.responder import respond, wsgi_environ
from django_controlplane.web.threads import Busy, WebThreads, serving, web_threads

Scope = dict[str, Any]


class BodyTooLarge(Exception):
    pass


# What SecurityMiddleware would add to these responses (its defaults).
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class AsyncViewHandler(ASGIHandler):
    """Django's ASGI handler for async views, without ``settings.MIDDLEWARE``.

    Every middleware we run is a sync one, so each costs two hops to a thread
    and back on the async path: eighteen per request. A thousand long-polls
    answered at the end of their wait queued up behind those hops on one
    thread and came back up to 1.6 s late. The async views (the remote-worker
    claim) need none of them: DRF authenticates each attempt by token, CSRF
    does not apply, no session is read. The security headers are added by the
    dispatcher (``SECURITY_HEADERS``).
    """

    def resolve_request(self, request: Any) -> Any:
        """The route's view, or its async twin (``parks``) for a read that waits."""
        match = super().resolve_request(request)
        twin = getattr(match.func, "parks", None)
        if twin is not None:
            match.func = twin
        return match

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=is_async)
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


def with_headers(send: Any, extra: list[tuple[bytes, bytes]]) -> Any:
    """A ``send`` that adds ``extra`` headers to the response's start (unless already set)."""

    async def send_with_headers(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", [])}
            added = [(k, v) for k, v in extra if k not in present]
            message = {**message, "headers": [*message.get("headers", []), *added]}
        await send(message)

    return send_with_headers


class HttpDispatcher:
    """ASGI app for ``http`` scopes: async views on the loop, sync views on bounded threads."""

    def __init__(self, threads: WebThreads | None = None) -> None:
        self._threads = threads
        self.asgi = AsyncViewHandler()
        self.wsgi = WSGIHandler()
        # Sync code Django itself runs around async views (an exception's response).
        self._middleware_thread = ThreadPoolExecutor(1, thread_name_prefix="web-async-mw")

    @property
    def threads(self) -> WebThreads:
        return self._threads or web_threads()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"HttpDispatcher serves HTTP only, not {scope['type']!r}.")
        # Long-polls count their wait from the head's arrival (stamped by ``serve``'s protocol,
        # else here), not from when a thread first got to them.
        if RECEIVED_AT not in scope:
            scope = {**scope, RECEIVED_AT: asyncio.get_running_loop().time()}
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            body = await read_body(scope, receive, limit)
        except BodyTooLarge:
            await send_too_large(send, limit or 0)
            return
        scope = with_content_length(scope, len(body))
        if self.is_async_view(scope):
            serving.set(self.threads)
            async with ThreadSensitiveContext(executor=self._middleware_thread):
                await self.asgi(scope, replay(body, receive), with_headers(send, SECURITY_HEADERS))
            return
        environ = wsgi_environ(scope, body)
        loop = asyncio.get_running_loop()
        try:
            response = await self.threads.call(respond, self.wsgi, environ, loop, send)
        except Busy:
            await send_busy(send)
            return
        if response is not None:
            await response.send(send)

    @staticmethod
    def is_async_view(scope: Scope) -> bool:
        root = scope.get("root_path", "")
        path = scope["path"]
        path_info = path[len(root) :] if root and path.startswith(root) else path
        path_info = path_info or "/"
        if len(path_info) > MAX_REMEMBERED_PATH:
            kind = _route_kind.__wrapped__(get_resolver(), path_info)
        else:
            kind = _route_kind(get_resolver(), path_info)
        return kind == ASYNC or (kind == PARKS and _asks_to_wait(scope))


# Resolving walks the URL patterns on the event loop for every request (about
# a tenth of the loop's time under 1,000 long-polls). A path's answer cannot
# change while its resolver (its URLconf) stays the same, so recent answers are
# kept: a bounded number, for paths of a bounded length.
MAX_REMEMBERED_PATH = 256


SYNC, ASYNC, PARKS = "sync", "async", "parks"  # PARKS: async only when asked to wait


@functools.lru_cache(maxsize=4096)
def _route_kind(resolver: URLResolver, path_info: str) -> str:
    try:
        match = resolver.resolve(path_info)
    except Resolver404:
        return SYNC
    if iscoroutinefunction(match.func):
        return ASYNC
    return PARKS if hasattr(match.func, "parks") else SYNC


def _asks_to_wait(scope: Scope) -> bool:
    """``wait`` among the query's names (its value is the view's to check)."""
    query = scope.get("query_string", b"")
    return any(pair.split(b"=", 1)[0] == b"wait" for pair in query.split(b"&"))


async def read_body(scope: Scope, receive: Any, limit: int | None) -> bytes:
    """The whole request body (chunked or not), refusing more than ``limit`` bytes."""
    declared = _header(scope, b"content-length")
    if limit is not None and declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def with_content_length(scope: Scope, length: int) -> Scope:
    """The scope with a ``Content-Length`` that matches the body read (and no chunked coding)."""
    headers = [
        (name, value)
        for name, value in scope.get("headers", [])
        if name.lower() not in (b"content-length", b"transfer-encoding")
    ]
    if length or scope.get("method") not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        headers.append((b"content-length", str(length).encode()))
    return {**scope, "headers": headers}


def replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands out the body once, then waits for the client's disconnect."""
    sent = False

    async def receive_again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin1").strip()
    return None


async def send_too_large(send: Any, limit: int) -> None:
    body = json.dumps(
        {
            "message": f"The request body is larger than {limit} bytes; send a smaller one.",
            "errors": {},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
