"""What no database here can store: the one definition enqueue, the API and the worker share.

PostgreSQL's text and jsonb hold no NUL character, no database encodes a
lone UTF-16 surrogate (valid JSON such as ``"\\ud800"`` produces one), and
JSON has no NaN or infinity. SQLite would store some of these and PostgreSQL
refuse them in the driver; refusing them before any write keeps both
databases alike and the error readable.

Nesting is bounded too: a payload, a result or an event's fields may hold at
most ``MAX_DEPTH`` levels of objects and arrays. Deeper values are legal JSON
but exhaust Python's recursion limit in whatever walks them next (schema
validation, the dashboard's pretty-printer, a client's decoder), so they are
refused here, where the walk is a loop and cannot fail that way.
"""

from __future__ import annotations

import datetime
import decimal
import json
import uuid
from collections.abc import Mapping
from typing import Any

from jobs.conf import knob
from jobs.exceptions import UnstorableValue

# Levels of nested objects and arrays in a payload, a result or an event's
# fields: ``{}`` is one level, ``{"a": []}`` two. Far beyond any real payload,
# and far below where recursive readers (json, jsonschema, templates) give up.
MAX_DEPTH = 64

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


REPLACEMENT = "\ufffd"


def printable(value: str) -> str:
    """``value`` with each NUL and lone surrogate replaced by U+FFFD.

    For echoing refused text back into a page or an error: the operator sees
    where the bad character was, and the response can always be encoded.
    """
    if text_problem(value) is None:
        return value
    return "".join(
        REPLACEMENT if ch == "\x00" or "\ud800" <= ch <= "\udfff" else ch for ch in value
    )


def depth_problem(max_depth: int = MAX_DEPTH) -> str:
    """The reason given for a value nested deeper than ``max_depth``."""
    return (
        f"is nested more than {max_depth} levels deep (objects and arrays); "
        "send a flatter structure"
    )


def _path(root: str, node: tuple[Any, ...] | None) -> str:
    """The dotted path of a node of the walk: ``(parent node, key)`` links back to the root."""
    keys: list[str] = []
    while node is not None:
        node, key = node
        keys.append(str(key))
    return ".".join([root, *reversed(keys)])


# Scalars that are always storable: the walk does not visit them.
_PLAIN = frozenset({int, bool})


def first_unstorable(
    value: Any, path: str = "payload", *, max_depth: int = MAX_DEPTH
) -> tuple[str, str] | None:
    """The first value under ``value`` that no database can store: (path, reason).

    A container deeper than ``max_depth`` levels counts as unstorable. The
    walk is a loop with its own stack (paths are built only for the value
    reported), so no nesting makes it raise ``RecursionError``. An object's
    keys are checked before any of its values.
    """
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(value, 0, None)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth, node = pop()
        kind = type(item)
        if kind is str or isinstance(item, str):
            if reason := text_problem(item):
                return _path(path, node), reason
        elif kind is float or isinstance(item, float):
            if item != item or item in (_INF, -_INF):
                return _path(path, node), f"is {item!r}; only finite numbers can be stored"
        elif isinstance(item, dict):
            if depth >= max_depth:
                return _path(path, node), depth_problem(max_depth)
            for key in item:
                if isinstance(key, str) and (reason := text_problem(key)):
                    return f"{_path(path, node)}.{key!r}", f"key {reason}"
            for key, child in reversed(item.items()):
                if not (child is None or type(child) in _PLAIN):
                    push((child, depth + 1, (node, key)))
        elif isinstance(item, list | tuple):
            if depth >= max_depth:
                return _path(path, node), depth_problem(max_depth)
            for index in range(len(item) - 1, -1, -1):
                child = item[index]
                if not (child is None or type(child) in _PLAIN):
                    push((child, depth + 1, (node, index)))
    return None


def too_deep(value: Any, path: str = "payload", *, max_depth: int = MAX_DEPTH) -> str | None:
    """The path of the first container nested deeper than ``max_depth``, or None.

    Cheaper than ``first_unstorable`` (scalars are not looked at), for callers
    that check text some other way.
    """
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(value, 0, None)]
    while stack:
        item, depth, node = stack.pop()
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list | tuple):
            children = enumerate(item)
        else:
            continue
        if depth >= max_depth:
            return _path(path, node)
        for key, child in children:
            if isinstance(child, dict | list | tuple):
                stack.append((child, depth + 1, (node, key)))
    return None


def unstorable_fields(fields: Mapping[str, Any]) -> dict[str, list[str]]:
    """Field errors for the values of ``fields`` no database can store, keyed by their path.

    For request bodies: ``{"result": {"a": "\\x00"}}`` gives
    ``{"result.a": ["The value contains a NUL character ..."]}``. The paths
    hold only storable text (a bad key is shown by its ``repr``), so the
    error itself can always be rendered.
    """
    errors: dict[str, list[str]] = {}
    for name, value in fields.items():
        found = first_unstorable(value, name)
        if found is not None:
            errors[found[0]] = [f"The value {found[1]}."]
    return errors


def unstorable_text(value: Any) -> str | None:
    """A sentence saying why ``value`` (any JSON value) cannot be stored, or None."""
    found = first_unstorable(value, "value")
    return None if found is None else f"The {found[0]} {found[1]}."


# --- what a run reports: results, progress, messages (docs/architecture.md,
# "Poison operations") ---------------------------------------------------------

# ``progress_current``/``progress_total`` are 32-bit integer columns on PostgreSQL.
PROGRESS_MAX = 2**31 - 1


class InvalidProgress(UnstorableValue):
    """A progress value that is not a whole number from 0 to ``PROGRESS_MAX``."""


class ResultTooLarge(UnstorableValue):
    """A result whose JSON is longer than ``MAX_RESULT_BYTES``."""


class EventMessageTooLong(UnstorableValue):
    """An event message longer than ``MAX_EVENT_MESSAGE_CHARS``."""


def check_event_message(text: str) -> None:
    """``EventMessageTooLong`` for a message an operation reports past the cap.

    Refused rather than cut: an operation that logs megabytes is a poison
    operation, and its job fails naming the cap, as one whose result is too
    large does. Messages the control plane writes itself (an error message
    becoming ``job.failed``'s) are cut with a marker instead (``cap_event_message``).
    """
    limit = int(knob("MAX_EVENT_MESSAGE_CHARS"))
    if 0 < limit < len(text):
        raise EventMessageTooLong(
            f"The event message is {len(text)} characters, more than MAX_EVENT_MESSAGE_CHARS "
            f"({limit}). Log less in one event, or store the text elsewhere and emit a reference."
        )


def progress_value(value: Any, what: str = "progress") -> int:
    """``value`` as a progress count, or ``InvalidProgress`` saying why not.

    Whole numbers from 0 to ``PROGRESS_MAX``; a float is taken only when it
    is finite and whole (``5.0``). Booleans, strings, NaN and infinities are
    refused.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidProgress(
            f"The {what} is {value!r} ({type(value).__name__}); "
            f"progress must be a whole number from 0 to {PROGRESS_MAX}."
        )
    if isinstance(value, float):
        if value != value or value in (_INF, -_INF) or not value.is_integer():
            raise InvalidProgress(
                f"The {what} is {value!r}; progress must be a whole number from 0 to "
                f"{PROGRESS_MAX}."
            )
        value = int(value)
    if not 0 <= value <= PROGRESS_MAX:
        raise InvalidProgress(
            f"The {what} is {value}; progress must be a whole number from 0 to {PROGRESS_MAX}."
        )
    return int(value)


def checked_progress(current: Any, total: Any) -> tuple[int | None, int | None]:
    """A (current, total) pair as stored: each checked by ``progress_value``;
    a ``current`` above its ``total`` is lowered to the total (clamped, not refused)."""
    checked_current = None if current is None else progress_value(current, "progress current")
    checked_total = None if total is None else progress_value(total, "progress total")
    if checked_current is not None and checked_total is not None:
        checked_current = min(checked_current, checked_total)
    return checked_current, checked_total


def truncated(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with a visible marker saying how much was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    if len(text) <= limit + _MARKER_ROOM and text.endswith(_MARKER_END):
        return text  # cut already (an error message becomes its event's message): once is enough
    return f"{text[:limit]}… [truncated: {len(text) - limit} of {len(text)} characters not stored]"


_MARKER_END = " characters not stored]"
_MARKER_ROOM = 64  # the marker's length, whatever the numbers in it


def cap_error_message(text: str) -> str:
    """An error message as stored: at most ``MAX_ERROR_MESSAGE_CHARS`` plus the marker."""
    return truncated(text, int(knob("MAX_ERROR_MESSAGE_CHARS"))) if text else text


def cap_event_message(text: str) -> str:
    """An event's message as stored: at most ``MAX_EVENT_MESSAGE_CHARS`` plus the marker."""
    return truncated(text, int(knob("MAX_EVENT_MESSAGE_CHARS"))) if text else text


def _documented(value: Any) -> Any:
    """The JSON form of the types a result may hold beyond JSON's own (docs/operations.md):
    ``datetime``/``date``/``time`` as ISO 8601 text, ``UUID`` and finite ``Decimal`` as text.
    Anything else (a set, bytes, any other object) is refused, never stringified."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return str(value)
    raise TypeError(f"a value of type {type(value).__name__} is not JSON")


def storable_json(value: Any, what: str = "result", *, max_bytes: int | None = None) -> Any:
    """``value`` as the database will store it, or ``UnstorableValue`` saying why not.

    JSON types only, plus the few ``_documented`` conversions; no NaN or
    infinity, nothing ``first_unstorable`` refuses, and (``max_bytes``) at most
    that many bytes of UTF-8 JSON (``ResultTooLarge``).
    """
    if value is None or type(value) in _PLAIN:
        return value
    try:
        text = json.dumps(value, default=_documented, allow_nan=False, ensure_ascii=False)
    except RecursionError:
        raise UnstorableValue(f"The {what} is nested too deeply to store.") from None
    except (TypeError, ValueError) as error:
        raise UnstorableValue(f"The {what} is not JSON: {error}.") from None
    if max_bytes is not None and len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise ResultTooLarge(
                f"The {what} is {size} bytes of JSON; at most {max_bytes} are stored "
                "(MAX_RESULT_BYTES). Store large outputs elsewhere and return a reference."
            )
    data = json.loads(text)
    found = first_unstorable(data, what)
    if found is not None:
        raise UnstorableValue(f"The {found[0]} {found[1]}.")
    return data
