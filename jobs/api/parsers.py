"""The JSON parser of every API view: bounded in size, never a 500 on odd input.

Recent DRF reads a JSON body through ``request.body``, where Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` check raises ``RequestDataTooBig`` (mapped to
413 by ``jobs.api.errors``); older DRF read the raw stream and skipped that
check. This parser applies the limit itself either way (413, in the API's
error shape) before decoding anything, and turns too-deep nesting into 400.
"""

from __future__ import annotations

import io
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def body_limit() -> int | None:
    """The largest body accepted, in bytes (settings ``DATA_UPLOAD_MAX_MEMORY_SIZE``)."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than {limit} bytes; send a smaller one."
    )


def _declared_length(parser_context: dict[str, Any] | None) -> int:
    request = (parser_context or {}).get("request")
    meta = getattr(request, "META", {}) if request is not None else {}
    try:
        return int(meta.get("CONTENT_LENGTH") or 0)
    except (TypeError, ValueError):
        return 0


class LimitedJSONParser(JSONParser):
    """``JSONParser`` that refuses bodies over the limit and too-deep nesting."""

    def parse(self, stream, media_type=None, parser_context=None):
        limit = body_limit()
        if limit is not None:
            if _declared_length(parser_context) > limit:
                raise too_large(limit)
            data = stream.read(limit + 1)
            if len(data) > limit:
                raise too_large(limit)
            stream = io.BytesIO(data)
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(
                "JSON parse error - the body is nested too deeply."
            ) from None
