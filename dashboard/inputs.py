"""Text an operator sends the dashboard (query strings, forms), checked in one place.

PostgreSQL's text and jsonb hold no NUL character, no database encodes a
lone UTF-16 surrogate, and JSON has no NaN or infinity. SQLite would take a
NUL and match on it while PostgreSQL's driver refuses it with a 500, so the
dashboard checks what an operator sends before any query or write sees it,
and behaves the same on both databases:

- a filter that cannot be read is reported on the page and not applied
  (``dashboard.filters.JobFilters.from_query``), as a malformed date or
  payload always was;
- a form (an action's POST, with the filter in its query string) carrying
  such text is refused with a 400 before the action runs
  (``dashboard.views.common.action``), so nothing is stored.

What counts as storable text is ``jobs.storable``'s definition, shared with
enqueue and the REST API; this module only applies it to request data and
to the payload filter's JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from jobs.storable import first_unstorable, text_problem

__all__ = [
    "MAX_JSON_DEPTH",
    "InvalidJSON",
    "parse_json_object",
    "printable",
    "request_problems",
    "text_problem",
]

# Levels of objects and arrays a payload filter may nest. A containment
# filter deeper than this matches nothing a person would look for, and the
# bound keeps every later walk (containment in Python, the SQL JSON path)
# far from Python's recursion limit and SQLite's JSON depth limit.
MAX_JSON_DEPTH = 32

REPLACEMENT = "\ufffd"
_JSON_EXAMPLE = '{"account": 42}'


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


def request_problems(*sources: Mapping[str, Any]) -> dict[str, str]:
    """A sentence per field of ``sources`` (QueryDicts) whose name or a value cannot be stored.

    Keys are the fields' printable names; an empty result means every text is fine.
    """
    problems: dict[str, str] = {}
    for source in sources:
        for key, values in _lists(source):
            name = printable(key)
            if reason := text_problem(key):
                problems[name] = f"The name of the field {name!r} {reason}."
                continue
            for value in values:
                if isinstance(value, str) and (reason := text_problem(value)):
                    problems[name] = f"The field {name!r} {reason}."
                    break
    return problems


def _lists(source: Mapping[str, Any]) -> Iterable[tuple[str, list[Any]]]:
    lists = getattr(source, "lists", None)
    if lists is not None:
        return list(lists())
    return [(key, [value]) for key, value in source.items()]


class InvalidJSON(ValueError):
    """The text is not a JSON object a filter can use; ``str()`` says why, as a sentence."""


def _refuse_constant(name: str) -> Any:
    raise InvalidJSON(f"{name} is not a number JSON allows: write a finite number.")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidJSON(f"The number {text[:40]} is too large to store: write a smaller one.")
    return value


def _too_deep(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than ``limit`` levels (a loop: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def parse_json_object(text: str, *, name: str = "payload") -> dict[str, Any]:
    """A non-empty JSON object every database can match against, or ``InvalidJSON``.

    Refused: text that is not JSON, NaN and Infinity, numbers too large for a
    float, NUL characters and lone surrogates (``"\\u0000"``, ``"\\ud800"``)
    in keys or strings, and nesting deeper than ``MAX_JSON_DEPTH``. Nothing
    here raises anything but ``InvalidJSON``, however hostile the text.
    """
    if reason := text_problem(text):
        raise InvalidJSON(f"The {name} filter {reason}.")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except InvalidJSON:
        raise
    except RecursionError:
        raise InvalidJSON(
            f"The {name} filter is nested more than {MAX_JSON_DEPTH} levels deep: "
            "write a flatter object."
        ) from None
    except ValueError:  # JSONDecodeError, and an integer of thousands of digits
        raise InvalidJSON(f"Write a JSON object, for example {_JSON_EXAMPLE}.") from None
    if not isinstance(value, dict) or not value:
        raise InvalidJSON(f"Write a non-empty JSON object, e.g. {_JSON_EXAMPLE}.")
    if _too_deep(value, MAX_JSON_DEPTH):
        raise InvalidJSON(
            f"The {name} filter is nested more than {MAX_JSON_DEPTH} levels deep: "
            "write a flatter object."
        )
    found = first_unstorable(value, name)
    if found is not None:
        raise InvalidJSON(f"The {found[0]} {found[1]}.")
    return value
