"""The payload filter: a JSON object a job's payload must contain, read and matched.

The filter reads like PostgreSQL's ``jsonb @>`` (objects by subset, arrays by
membership); ``json_contains`` answers the same in Python for one job summary
(the live relay). ``parse_json_object`` turns what an operator typed into a
filter every database can match against, or says why it cannot.
"""

from __future__ import annotations

import json
import math
from typing import Any

from jobs.storable import first_unstorable, text_problem

# Levels of objects and arrays a payload filter may nest. A containment
# filter deeper than this matches nothing a person would look for, and the
# bound keeps every later walk (containment in Python, the SQL JSON path)
# far from Python's recursion limit and SQLite's JSON depth limit.
MAX_JSON_DEPTH = 32

_JSON_EXAMPLE = '{"account": 42}'


def json_contains(doc: Any, pattern: Any) -> bool:
    """PostgreSQL's ``jsonb @>`` in Python: objects by subset, arrays by membership."""
    if isinstance(pattern, dict):
        return isinstance(doc, dict) and all(
            k in doc and json_contains(doc[k], v) for k, v in pattern.items()
        )
    if isinstance(pattern, list):
        if not isinstance(doc, list):
            return False
        return all(any(json_contains(d, p) for d in doc) for p in pattern)
    if isinstance(pattern, bool) or isinstance(doc, bool):
        return type(doc) is type(pattern) and doc == pattern
    return doc == pattern


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
