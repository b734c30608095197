"""Reading single query values: ids, timestamps, page sizes, and the error that names a field.

Shared by the filter reader, the cursors and every face that takes a value
from a person (a query string, a JSON body, a command-line option), so an id
or a time is read the same way everywhere and never raises anything but
``InvalidFilter``.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime


class InvalidFilter(ValueError):
    """A filter, cursor or limit could not be read; ``errors`` maps fields to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        self.errors = errors
        super().__init__("The filters are invalid: fix the fields named in 'errors'.")


def parse_uuid(value: Any) -> uuid.UUID | None:
    """``value`` as a UUID, or None when it is not one (never raises)."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def parse_timestamp(value: Any) -> datetime | None:
    """An ISO 8601 timestamp in UTC (naive means UTC), or None when it is not one.

    A ``+`` of an offset that arrived unencoded in a query string reads as a
    space; it is put back. A time whose UTC equivalent falls outside years
    1 to 9999 (``0001-01-01T00:00+05:00``) is not one either: converting it
    for the database would overflow (a 500 on SQLite) instead of matching
    nothing.
    """
    if isinstance(value, datetime):
        parsed: datetime | None = value
    elif isinstance(value, str):
        text = value.strip()
        if "T" in text and " " in text:
            text = text.replace(" ", "+", 1)
        try:
            parsed = parse_datetime(text)
        except ValueError:
            return None
    else:
        return None
    if parsed is None:
        return None
    if timezone.is_naive(parsed):
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


def parse_limit(raw: Any, *, default: int, maximum: int, name: str = "limit") -> int:
    """A page size from a query value: 1..``maximum``, ``default`` when absent."""
    if raw in (None, ""):
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidFilter({name: [f"'{name}' must be a whole number."]}) from None
    if not 1 <= value <= maximum:
        raise InvalidFilter({name: [f"'{name}' must be from 1 to {maximum}."]})
    return value
