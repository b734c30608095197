"""One error shape for every 4xx: ``{"message": ..., "errors": {field: [...]}}``."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from jobs.exceptions import EnqueueError, IllegalTransition, JobNotFound, LeaseLost


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


def error_response(message: str, code: int, errors: dict[str, list[str]] | None = None) -> Response:
    return Response({"message": message, "errors": errors or {}}, status=code)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, EnqueueError):
        return error_response(exc.message, status.HTTP_400_BAD_REQUEST, exc.errors)
    if isinstance(exc, JobNotFound):
        return error_response(str(exc), status.HTTP_404_NOT_FOUND)
    if isinstance(exc, (IllegalTransition, LeaseLost)):
        return error_response(str(exc), status.HTTP_409_CONFLICT)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = {
            "message": "The request is invalid: fix the fields named in 'errors'.",
            "errors": _flatten(exc.detail),
        }
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = {"message": str(detail), "errors": {}}
    return response
