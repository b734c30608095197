"""``?wait=S`` on a read route: answer the moment the job (or workflow) ends, or after S seconds.

The route's view is async (``long_poll_view``), so the web process's
dispatcher serves it on the event loop (``django_controlplane.web.dispatch``).
Its reads are the route's ordinary DRF view, run as a blocking step on the web
threads (``run_blocking``: the step's connection goes back to the pool at
once), exactly as the parked claim runs its attempts
(``django_controlplane.remote.claim_view``). When the DRF view finds the
object still active and was asked to wait, it marks its response
(``park``); the async view then parks on the process's end waiters
(``django_controlplane.api.waiters``) holding no thread and no database
connection, and reads again (the DRF view once more: authentication,
permission and error shape as always) when woken or when the wait is up.

The async path of the dispatcher runs no middleware, so the blocking step
gives the request its session and user itself (``with_session``): a signed-in
operator long-polls as a token does.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.waiters import JOB, end_waiters
from django_controlplane.web.dispatch import RECEIVED_AT
from django_controlplane.web.overload import BUSY_MESSAGE, unavailable_response
from django_controlplane.web.threads import Busy, run_blocking
from jobs.awaiting import wait_for_job, wait_for_workflow

MAX_WAIT_SECONDS = 60.0
WAIT_PARAMETER = OpenApiParameter(
    "wait",
    OpenApiTypes.NUMBER,
    description=f"Seconds, above 0 and at most {MAX_WAIT_SECONDS:g}: answer the moment it "
    "ends (succeeded, failed or cancelled), or when the wait is up with its state then. "
    "The request holds no database connection while it waits.",
)
SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"
AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"


@dataclass(frozen=True)
class Park:
    """What a DRF view asks of its async wrapper: wait for ``kind`` ``id`` to end."""

    kind: str
    id: uuid.UUID
    seconds: float


def wait_seconds(request: Request) -> float | None:
    """The ``wait`` query parameter (None without one); a 400 naming it when it is bad."""
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_WAIT_SECONDS:
        raise ValidationError(
            {
                "wait": [
                    f"'wait' must be a number of seconds above 0 and at most {MAX_WAIT_SECONDS:g}."
                ]
            }
        )
    return seconds


def park(
    request: Request, response: Response, kind: str, object_id: uuid.UUID, ended: bool
) -> Response:
    """Mark ``response`` for its wrapper to wait, when asked to, the object is still active, and
    this is the first read (the read after waiting answers whatever it finds)."""
    seconds = wait_seconds(request)
    if seconds is not None and not ended and not getattr(request._request, "long_poll_done", False):
        response.long_poll = Park(kind, object_id, seconds)
    return response


def with_session(request: HttpRequest) -> None:
    """Give a request that skipped the middleware its session and user (a signed-in operator's
    long-poll), as ``SessionMiddleware`` and ``AuthenticationMiddleware`` would."""
    if not hasattr(request, "session") and SESSION_MIDDLEWARE in settings.MIDDLEWARE:
        from django.contrib.sessions.middleware import SessionMiddleware

        SessionMiddleware(lambda r: HttpResponse()).process_request(request)
    if not hasattr(request, "user") and AUTH_MIDDLEWARE in settings.MIDDLEWARE:
        from django.contrib.auth.middleware import AuthenticationMiddleware

        AuthenticationMiddleware(lambda r: HttpResponse()).process_request(request)


class SharedReads:
    """The read after a wait, shared by the requests parked on the same object.

    A thousand requests parked on one job all wake when it ends; each reading
    it again through its own DRF view made a thousand reads at once, which
    the two web threads answered in seconds, some of them 503. Each was
    authenticated and permitted by its first read; what it answers now is
    the object's state at any moment after it woke, so a read that started
    after that moment serves it. One such read (the first woken request's)
    is shared; a request whose shared read was not a 200 reads on its own.
    """

    KEEP_SECONDS = 0.5  # how long a finished read serves requests woken before it started

    def __init__(self) -> None:
        self._reads: dict[Hashable, tuple[float, asyncio.Future[HttpResponse]]] = {}

    async def read(
        self, key: Hashable, since: float, start: Callable[[], Awaitable[HttpResponse]]
    ) -> HttpResponse | None:
        """A 200 read started at or after ``since`` (loop time), or None."""
        loop = asyncio.get_running_loop()
        kept = self._reads.get(key)
        if kept is None or kept[0] < since:
            future = asyncio.ensure_future(start())
            kept = self._reads[key] = (loop.time(), future)
            future.add_done_callback(
                lambda done: loop.call_later(self.KEEP_SECONDS, self._forget, key, done)
            )
        response = await asyncio.shield(kept[1])
        if response.status_code != 200:
            return None
        return copied(response)

    def _forget(self, key: Hashable, future: asyncio.Future[HttpResponse]) -> None:
        kept = self._reads.get(key)
        if kept is not None and kept[1] is future:
            del self._reads[key]


def copied(response: HttpResponse) -> HttpResponse:
    """A response of its own for each request (a response is sent, then closed, once)."""
    return HttpResponse(
        response.content, status=response.status_code, headers=dict(response.items())
    )


shared_reads = SharedReads()


def long_poll_view(drf_view: type[Any]) -> Any:
    """The async view of a DRF read view that may ``park`` its response."""
    inner = drf_view.as_view()

    def read_once(request: HttpRequest, kwargs: dict[str, Any]) -> HttpResponse:
        with_session(request)
        response = inner(request, **kwargs)
        return response.render() if hasattr(response, "render") else response

    async def read(request: HttpRequest, kwargs: dict[str, Any]) -> HttpResponse:
        try:
            return await run_blocking(read_once, request, kwargs)
        except Busy:
            return unavailable_response(BUSY_MESSAGE)

    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        """The dispatcher's: reads on the web threads, parks on the loop holding nothing."""
        loop = asyncio.get_running_loop()
        arrived = getattr(request, "scope", {}).get(RECEIVED_AT, loop.time())
        response = await read(request, kwargs)
        parked: Park | None = getattr(response, "long_poll", None)
        if parked is None:
            return response
        remaining = arrived + parked.seconds - loop.time()
        await end_waiters.wait(parked.kind, parked.id, remaining)
        request.long_poll_done = True  # type: ignore[attr-defined]
        host = request.META.get("HTTP_HOST", "")  # the answer names it (the jobs URL)
        key = (drf_view, parked.kind, parked.id, host, request.path.rstrip("/"))
        shared = await shared_reads.read(key, loop.time(), lambda: read(request, kwargs))
        return shared if shared is not None else await read(request, kwargs)

    def waiting_read(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        """The route as every server runs it: the DRF view, through the middleware. Asked
        to wait without the dispatcher's event loop (runserver, a WSGI server, the test
        client), it waits here, holding its thread (``jobs.awaiting``)."""
        response = inner(request, **kwargs)
        parked: Park | None = getattr(response, "long_poll", None)
        if parked is None:
            return response
        wait = wait_for_job if parked.kind == JOB else wait_for_workflow
        try:
            wait(parked.id, parked.seconds)
        except ObjectDoesNotExist:
            pass  # gone meanwhile: the read below says so
        request.long_poll_done = True  # type: ignore[attr-defined]
        return inner(request, **kwargs)

    waiting_read = csrf_exempt(waiting_read)
    # The dispatcher serves a request with ``wait`` by the async twin, on its event loop.
    waiting_read.parks = csrf_exempt(view)  # type: ignore[attr-defined]
    # For drf-spectacular: /schema describes the route from the DRF view.
    waiting_read.cls = drf_view  # type: ignore[attr-defined]
    waiting_read.view_class = drf_view  # type: ignore[attr-defined]
    waiting_read.initkwargs = {}  # type: ignore[attr-defined]
    return waiting_read
