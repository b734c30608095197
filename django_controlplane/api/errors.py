"""One error shape for every 4xx (and 5xx): ``{"message": ..., "errors": {field: [...]}}``.

``exception_handler`` is DRF's (settings ``EXCEPTION_HANDLER``): it renders
the project's exceptions and DRF's own in that shape, and Django's
``SuspiciousOperation`` family (more than ``DATA_UPLOAD_MAX_NUMBER_FIELDS``
query parameters, a bad Host header) as 400. ``handler400``, ``handler403``,
``handler404`` and ``handler500`` do the same for requests that never reach a
DRF view (rejected by middleware, an unknown API path, an unexpected crash)
when the path belongs to the API; other paths (the dashboard, the admin) keep
Django's HTML pages. ``api_not_found`` is routed after every API route, so an
unknown API path is JSON even with ``DEBUG`` on (Django's debug 404 page
never calls ``handler404``).
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from typing import Any

from django.conf import settings
from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from django_controlplane.api.parsers import body_limit, too_large
from django_controlplane.web.overload import response_for_unavailable
from jobs.exceptions import EnqueueError, IllegalTransition, JobNotFound, LeaseLost
from jobs.selectors import InvalidFilter

logger = logging.getLogger("django_controlplane.api")

# First path segments served by the REST API (with or without a trailing slash).
API_PREFIXES = (
    "jobs",
    "queues",
    "keys",
    "workers",
    "operations",
    "schedules",
    "workflows",
    "schema",
    "metrics",
)


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.update(_flatten(value, name))
        return out
    if isinstance(detail, list):
        if all(not isinstance(v, (dict, list)) for v in detail):
            return {prefix or "non_field_errors": [str(v) for v in detail]}
        out = {}
        for index, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix or "non_field_errors": [str(detail)]}


def _renderable(text: str) -> str:
    """``text`` with lone surrogates written as ``\\udxxx``, so the JSON renderer can encode it.

    DRF's messages quote what the client sent (an unknown field's name, a
    choice, a UUID); a lone surrogate there (JSON ``"\\ud800"``) made the
    renderer's UTF-8 encoding fail and turned a 400 into a 500.
    """
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def error_body(message: str, errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The one error shape, every string in it encodable whatever the client sent."""
    return {
        "message": _renderable(str(message)),
        "errors": {
            _renderable(str(field)): [
                _renderable(str(m))
                for m in (messages if isinstance(messages, list | tuple) else [messages])
            ]
            for field, messages in (errors or {}).items()
        },
    }


def error_response(message: str, code: int, errors: dict[str, list[str]] | None = None) -> Response:
    return Response(error_body(message, errors), status=code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, EnqueueError):
        return error_response(exc.message, status.HTTP_400_BAD_REQUEST, exc.errors)
    if isinstance(exc, InvalidFilter):
        return error_response(str(exc), status.HTTP_400_BAD_REQUEST, exc.errors)
    if isinstance(exc, JobNotFound):
        return error_response(str(exc), status.HTTP_404_NOT_FOUND)
    if isinstance(exc, (IllegalTransition, LeaseLost)):
        return error_response(str(exc), status.HTTP_409_CONFLICT)
    if isinstance(exc, RequestDataTooBig):
        # Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check (DRF reads request.body).
        exc = too_large(body_limit() or 0)
    elif isinstance(exc, SuspiciousOperation):
        # TooManyFieldsSent, DisallowedHost, ...: Django answers these 400 (or a
        # debug page) only when they escape the view; here they stay JSON.
        logger.warning("Refused a suspicious request: %s", exc)
        return error_response(suspicious_message(exc), status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body(
            "The request is invalid: fix the fields named in 'errors'.", _flatten(exc.detail)
        )
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(str(detail))
    return response


def is_api_path(path: str) -> bool:
    """True for paths the REST API owns (``/jobs…``, ``/queues…``… under the mount point)."""
    from django_controlplane.mount import NotMounted, mount_prefix

    try:
        prefix = mount_prefix()
    except NotMounted:
        return False
    if not path.startswith(prefix):
        return False
    first = path[len(prefix) :].split("/", 1)[0]
    return first in API_PREFIXES


def suspicious_message(exc: BaseException) -> str:
    """A sentence for a ``SuspiciousOperation`` that tells the client what to change."""
    name = type(exc).__name__
    if name == "TooManyFieldsSent":
        return (
            f"The request has more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} "
            "parameters; send fewer."
        )
    if name == "DisallowedHost":
        return "The Host header names a host this server does not serve."
    return "The request was refused as malformed; check its headers and parameters."


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Requests refused before any view (bad Host header, too many parameters): JSON for the API."""
    if is_api_path(request.path):
        message = (
            suspicious_message(exception) if exception is not None else "The request is malformed."
        )
        return JsonResponse(error_body(message), status=400)
    return defaults.bad_request(request, exception)


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """``PermissionDenied`` raised outside a DRF view: JSON for the API."""
    if is_api_path(request.path):
        detail = (
            str(exception)
            if isinstance(exception, PermissionDenied) and str(exception)
            else "You do not have permission to perform this action."
        )
        return JsonResponse(error_body(detail), status=403)
    return defaults.permission_denied(request, exception)


@csrf_exempt  # a POST with a session cookie still gets this JSON, not the CSRF page
def api_not_found(request: HttpRequest) -> HttpResponse:
    """The last API route: any other path under an API prefix, any method, DEBUG or not."""
    return JsonResponse(
        error_body(f"There is no API route at {request.path}; see /schema for the routes."),
        status=404,
    )


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Unknown URLs under the API answer JSON in the error shape; others get Django's page."""
    if is_api_path(request.path):
        return JsonResponse(
            error_body(f"There is no API route at {request.path}; see /schema for the routes."),
            status=404,
        )
    return defaults.page_not_found(request, exception)


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id(request: HttpRequest) -> str:
    """The client's or proxy's ``X-Request-ID`` when it is a plain token, else a new one."""
    given = request.headers.get("X-Request-ID", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def handler500(request: HttpRequest) -> HttpResponse:
    """An unexpected error: logged with a request id, answered without a traceback.

    The log line (``django_controlplane.api``, ERROR, with the traceback) names the request
    id, and so do the answer's ``X-Request-ID`` header and, under the API,
    its message, so an operator can find the traceback a client reports;
    Django's own ``django.request`` logger reaches no handler while DEBUG is
    off. A full connection pool or database met before any view ran (a
    session read in middleware) is no bug: that is a 503 with Retry-After.
    """
    error = sys.exc_info()[1]
    unavailable = response_for_unavailable(request, error)
    if unavailable is not None:
        return unavailable
    rid = request_id(request)
    logger.error(
        "Internal server error on %s %s (request id %s): %s",
        request.method,
        request.path,
        rid,
        type(error).__name__ if error is not None else "unknown error",
        exc_info=error is not None,
        extra={"request_id": rid},
    )
    response: HttpResponse
    if is_api_path(request.path):
        response = JsonResponse(
            error_body(
                "The server failed to handle this request; the error has been logged "
                f"with request id {rid}."
            ),
            status=500,
        )
    else:
        response = defaults.server_error(request)
    response["X-Request-ID"] = rid
    return response
