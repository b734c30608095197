"""Property tests of ``jobs.storable`` (no database): any JSON value gets an answer, never an error.

The oracle is what the databases need: a value is storable exactly when it
serialises as strict JSON (no NaN or infinity), encodes as UTF-8 (no lone
surrogate), holds no NUL character, and is at most ``MAX_DEPTH`` levels deep.
Runs are derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.storable import MAX_DEPTH, first_unstorable, too_deep, unstorable_fields, unstorable_text

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Text as JSON can carry it: any code point, with NUL and lone surrogates often.
HOSTILE = st.sampled_from(["\x00", "\ud800", "\udfff", "\udc80", "\u2028", "\ufeff", "é", "𝄞"])
TEXT = st.text(alphabet=st.one_of(st.characters(), HOSTILE), max_size=12)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and infinities included: Python's json produces them from 1e400
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=25,
)


def _nested(depth: int, container: str, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if container == "object" else [value]
    return value


DEEP = st.builds(
    _nested,
    st.integers(min_value=0, max_value=3000),
    st.sampled_from(["object", "array"]),
    st.one_of(SCALARS, JSON),
)


def _depth(value: Any) -> int:
    """Levels of objects and arrays, counted with a loop (the values may be thousands deep)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _strings(value: Any) -> list[str]:
    """Every string in ``value``, keys included (a loop: the values may be thousands deep)."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            out.extend(key for key in item if isinstance(key, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _storable(value: Any) -> bool:
    if _depth(value) > MAX_DEPTH:
        return False
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    for text in _strings(value):
        try:
            text.encode()
        except UnicodeEncodeError:
            return False
        if "\x00" in text:
            return False
    return True


@PROPERTY
@given(st.one_of(JSON, DEEP))
def test_first_unstorable_answers_for_any_value_and_agrees_with_the_databases(value):
    found = first_unstorable(value)
    assert (found is None) == _storable(value), found
    if found is not None:
        path, reason = found
        assert path.startswith("payload") and reason
        path.encode()  # an error naming it can always be rendered
        reason.encode()


@PROPERTY
@given(st.one_of(JSON, DEEP))
def test_too_deep_is_exactly_the_depth_limit(value):
    where = too_deep(value)
    assert (where is None) == (_depth(value) <= MAX_DEPTH)


@settings(PROPERTY, max_examples=80)
@given(
    st.dictionaries(
        st.sampled_from(["result", "fields", "message", "x"]), st.one_of(JSON, DEEP), max_size=3
    )
)
def test_unstorable_fields_names_each_bad_field_renderably(fields):
    errors = unstorable_fields(fields)
    assert set(errors) == {
        path
        for name, value in fields.items()
        if (found := first_unstorable(value, name))
        for path in [found[0]]
    }
    json.dumps(errors, ensure_ascii=False).encode()  # what the renderer does
    for name, value in fields.items():
        reason = unstorable_text(value)
        assert (reason is None) == (first_unstorable(value, name) is None)
