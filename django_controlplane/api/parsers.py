"""The JSON parser of every API view: bounded in size, never a 500 on odd input.

Recent DRF reads a JSON body through ``request.body``, where Django's
``DATA_UPLOAD_MAX_MEMORY_SIZE`` check raises ``RequestDataTooBig`` (mapped to
413 by ``django_controlplane.api.errors``); older DRF read the raw stream and skipped that
check. This parser applies the limit itself either way (413, in the API's
error shape) before decoding anything, and turns too-deep nesting into 400.

It also refuses numbers JSON can carry but nothing downstream can hold:
``1e400`` (or a 400-digit literal) reads as ``inf`` in Python's ``json``,
which PostgreSQL's jsonb rejects (a 500) and SQLite stores as text that no
longer parses (the list then crashes). They are a 400 naming the field,
before any view sees the body. ``NaN`` and ``Infinity`` literals are already
a parse error (DRF's ``STRICT_JSON``).
"""

from __future__ import annotations

import codecs
import io
import math
from typing import Any

from django.conf import settings
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils import json


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def body_limit() -> int | None:
    """The largest body accepted, in bytes (settings ``DATA_UPLOAD_MAX_MEMORY_SIZE``)."""
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than {limit} bytes; send a smaller one.")


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
            raw = stream.read(limit + 1)
            if len(raw) > limit:
                raise too_large(limit)
            stream = io.BytesIO(raw)
        non_finite: list[str] = []

        def read_float(text: str) -> float:
            value = float(text)
            if not math.isfinite(value):
                non_finite.append(text)
            return value

        encoding = get_encoding(parser_context or {})  # text codecs only (no bz2 bombs)
        constants = json.strict_constant if self.strict else None
        try:
            data = json.load(
                codecs.getreader(encoding)(stream),
                parse_constant=constants,
                parse_float=read_float,
            )
        except RecursionError:
            raise exceptions.ParseError(
                "JSON parse error - the body is nested too deeply."
            ) from None
        except ValueError as error:  # UnicodeDecodeError and JSONDecodeError included
            raise exceptions.ParseError(f"JSON parse error - {error}") from None
        if non_finite:
            raise exceptions.ValidationError(non_finite_errors(data, non_finite[0]))
        return data


def non_finite_errors(data: Any, literal: str) -> dict[str, list[str]]:
    """Field errors for the first non-finite number in ``data`` (top-level field as the key)."""
    path = _non_finite_path(data) or []
    field = str(path[0]) if path and isinstance(data, dict) else "non_field_errors"
    where = ".".join(str(p) for p in path) or "the body"
    shown = literal if len(literal) <= 40 else f"{literal[:37]}..."
    return {
        field: [
            f"{where} is {shown}, which is too large to be a finite number; "
            "send numbers between about -1.8e308 and 1.8e308."
        ]
    }


def _non_finite_path(value: Any) -> list[Any] | None:
    """The path (keys and indexes) to the first non-finite float in ``value``, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else []
    items = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list) else ())
    )
    for key, item in items:
        inner = _non_finite_path(item)
        if inner is not None:
            return [key, *inner]
    return None
