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

from collections.abc import Mapping
from typing import Any

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
