"""What no database here can store: the one definition enqueue, the API and the worker share.

PostgreSQL's text and jsonb hold no NUL character, no database encodes a
lone UTF-16 surrogate (valid JSON such as ``"\\ud800"`` produces one), and
JSON has no NaN or infinity. SQLite would store some of these and PostgreSQL
refuse them in the driver; refusing them before any write keeps both
databases alike and the error readable.
"""

from __future__ import annotations

from typing import Any

_INF = float("inf")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (a NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "contains a NUL character (\\u0000), which cannot be stored"
    try:
        value.encode()
    except UnicodeEncodeError as error:
        bad = value[error.start]
        return f"contains a lone surrogate (\\u{ord(bad):04x}), which is not valid Unicode"
    return None


def first_unstorable(value: Any, path: str = "payload") -> tuple[str, str] | None:
    """The first value under ``value`` that no database can store: (path, reason).

    Enqueue walks it only when the fast checks on the serialised payload
    found something, to name the field in the error.
    """
    if isinstance(value, float) and (value != value or value in (_INF, -_INF)):
        return path, f"is {value!r}; only finite numbers can be stored"
    if isinstance(value, str):
        reason = text_problem(value)
        return (path, reason) if reason else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and (reason := text_problem(key)):
                return f"{path}.{key!r}", f"key {reason}"
            found = first_unstorable(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = first_unstorable(item, f"{path}.{index}")
            if found:
                return found
    return None


def unstorable_text(value: Any) -> str | None:
    """A sentence saying why ``value`` (any JSON value) cannot be stored, or None."""
    found = first_unstorable(value, "value")
    return None if found is None else f"The {found[0]} {found[1]}."
