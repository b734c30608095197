"""One error shape for every 4xx (and 5xx): ``{"message": ..., "errors": {field: [...]}}``.

``exception_handler`` is DRF's (settings ``EXCEPTION_HANDLER``): it renders
the project's exceptions and DRF's own in that shape. ``handler404`` and
``handler500`` do the same for requests that never reach a DRF view (an
unknown API path, an unexpected crash) when the path belongs to the API;
other paths keep Django's pages.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.api.parsers import body_limit, too_large
from jobs.exceptions import EnqueueError, IllegalTransition, JobNotFound, LeaseLost
from jobs.selectors import InvalidFilter

logger = logging.getLogger("jobs.api")

# First path segments served by the REST API (with or without a trailing slash).
API_PREFIXES = ("jobs", "queues", "workers", "schema")


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


def error_body(message: str, errors: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {"message": message, "errors": errors or {}}


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
    """True for paths the REST API owns (``/jobs…``, ``/queues…``, ``/workers…``, ``/schema…``)."""
    first = path.lstrip("/").split("/", 1)[0]
    return first in API_PREFIXES


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Unknown URLs under the API answer JSON in the error shape; others get Django's page."""
    if is_api_path(request.path):
        return JsonResponse(
            error_body(f"There is no API route at {request.path}; see /schema for the routes."),
            status=404,
        )
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    """An unexpected error under the API answers JSON without a traceback."""
    if is_api_path(request.path):
        return JsonResponse(
            error_body("The server failed to handle this request; the error has been logged."),
            status=500,
        )
    return defaults.server_error(request)
