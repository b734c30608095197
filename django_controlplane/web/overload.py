"""A clean 503 with ``Retry-After`` when the web process or its database is saturated.

Three things can run out under load: this process's threads (``django_controlplane.web.threads``),
its connection pool (a request waits ``WEB_DB_POOL_TIMEOUT_SECONDS`` for a
connection, then psycopg-pool gives up), and the PostgreSQL server's own
``max_connections``. None of them is the client's fault or a bug, so none may
be a 500: the client is told to come back shortly. A database that is down or
restarting is answered the same way.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils.deprecation import MiddlewareMixin

log = logging.getLogger("django_controlplane.web")

RETRY_AFTER_SECONDS = 1
BUSY_MESSAGE = "The server is busy; retry after the number of seconds in the Retry-After header."
DATABASE_MESSAGE = (
    "The database is unavailable or has no free connection; "
    "retry after the number of seconds in the Retry-After header."
)

# SQLSTATEs that mean "no capacity or no server", not "this request is wrong":
# too_many_connections, insufficient_resources, and the shutdown/startup family.
_UNAVAILABLE_SQLSTATES = {"53300", "53000", "57P01", "57P02", "57P03"}


def is_unavailable(error: BaseException | None) -> bool:
    """True when ``error`` (or what caused it) says the database has no room or is not there."""
    seen = 0
    while error is not None and seen < 10:
        name = type(error).__name__
        if name in {"PoolTimeout", "TooManyRequests", "PoolClosed"}:
            return True
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate in _UNAVAILABLE_SQLSTATES or (sqlstate or "").startswith("08"):
            return True
        if name == "OperationalError" and "too many clients" in str(error):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def unavailable_response(message: str = DATABASE_MESSAGE) -> JsonResponse:
    response = JsonResponse({"message": message, "errors": {}}, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def response_for_unavailable(request: HttpRequest, error: BaseException | None) -> Any:
    """The 503 for ``error`` if it is a capacity or outage error, else None."""
    if not is_unavailable(error):
        return None
    log.warning("Answered 503 to %s %s: %s", request.method, request.path, error)
    return unavailable_response()


async def send_busy(send: Any) -> None:
    """Answer an ASGI HTTP request 503 before any thread or connection was spent on it."""
    body = json.dumps({"message": BUSY_MESSAGE, "errors": {}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    """Turns a view's pool timeout or "too many clients" into the 503 above.

    Errors raised before a view runs (a session read in middleware) reach
    ``handler500`` instead, which asks ``response_for_unavailable`` too.
    Sync and async capable, so a parked long-poll holds no thread for it.
    """

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        return response_for_unavailable(request, exception)
