"""Property tests of payload schemas and their validator (no database).

* Any JSON value offered as a schema gets an answer from ``schema_problem``
  (a sentence or None), never an exception.
* A schema it accepts compiles, and any payload then gets field errors or
  none, never an exception: hostile text, NaN, thousands of levels, a
  ``$ref`` that loops or points nowhere.
* Where RE2 and Python's ``re`` mean the same thing, the validator agrees with
  plain ``jsonschema`` (Draft 2020-12) on which payloads are valid: RE2 and
  the fast path change how long it takes, not the answer.
* Payloads ``hypothesis-jsonschema`` generates from a schema are accepted.

Runs are derandomized, so CI sees the same examples every time.
"""

from __future__ import annotations

import time
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from jobs.operations import (
    MAX_SCHEMA_DEPTH,
    InvalidPayloadSchema,
    OperationRegistry,
    PayloadValidator,
    operation,
    schema_problem,
)
from jobs.storable import MAX_DEPTH

from .test_properties_storable import DEEP, JSON, TEXT

PROPERTY = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Patterns on which RE2 and Python's re agree for the strings below (no \d \w \s,
# whose Unicode reach differs, and no newline in the strings, where "$" differs:
# RE2 follows ECMA-262, Python also matches before a final newline).
SAFE_PATTERNS = ["^(a+)+$", "^[a-z]+$", "a|b", "^$", "(x+x+)+y", ".*", "^a.*z$", "[0-9]{2,}", "é"]
# Anything at all, most of it not a regex either engine compiles.
ANY_PATTERNS = st.one_of(
    st.sampled_from([*SAFE_PATTERNS, "(a)\\1", "(?=a)", "(?<!a)b", "a{1000}{1000}", "\\p{L}"]),
    st.text(alphabet="ab()+*?|^$[]{}\\.,0-9<=!:P", max_size=10),
)
SHORT = st.text(alphabet="abxyz019é-", max_size=12)  # payload strings for the agreement test
KEYS = st.sampled_from(["a", "b", "xx", "aaa", "n"])


def schemas(patterns: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """Small Draft 2020-12 schemas over the keywords that matter here."""
    numbers = st.sampled_from([0, 1, 3, 0.1, 1e-9, 2.5, -4])
    leaves = st.one_of(
        st.just({}),
        st.booleans(),
        st.sampled_from(["string", "integer", "number", "object", "array", "boolean", "null"]).map(
            lambda t: {"type": t}
        ),
        st.fixed_dictionaries(
            {"type": st.just("string")},
            optional={
                "pattern": patterns,
                "minLength": st.integers(0, 4),
                "maxLength": st.integers(0, 8),
            },
        ),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["number", "integer"])},
            optional={"minimum": numbers, "maximum": numbers, "multipleOf": numbers.filter(bool)},
        ),
        st.lists(st.one_of(st.none(), st.integers(-3, 3), SHORT), min_size=1, max_size=3).map(
            lambda values: {"enum": values}
        ),
        st.sampled_from(["#", "#/$defs/d", "#/nope"]).map(lambda ref: {"$ref": ref}),
    )

    def combine(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("object")},
                optional={
                    "properties": st.dictionaries(KEYS, inner, max_size=3),
                    "patternProperties": st.dictionaries(patterns, inner, max_size=2),
                    "additionalProperties": st.one_of(st.booleans(), inner),
                    "required": st.lists(KEYS, max_size=2, unique=True),
                    "propertyNames": inner,
                    "unevaluatedProperties": st.booleans(),
                },
            ),
            st.fixed_dictionaries(
                {"type": st.just("array")},
                optional={
                    "items": inner,
                    "prefixItems": st.lists(inner, min_size=1, max_size=2),
                    "uniqueItems": st.booleans(),
                    "contains": inner,
                    "minItems": st.integers(0, 3),
                },
            ),
            st.builds(
                lambda word, parts: {word: parts},
                st.sampled_from(["anyOf", "allOf", "oneOf"]),
                st.lists(inner, min_size=1, max_size=3),
            ),
            inner.map(lambda s: {"not": s}),
            st.fixed_dictionaries({"if": inner}, optional={"then": inner, "else": inner}),
            st.builds(
                lambda d, sibling: {"$ref": "#/$defs/d", "$defs": {"d": d}, **sibling},
                inner,
                st.one_of(st.just({}), inner.filter(lambda s: isinstance(s, dict))),
            ),
        )

    return st.recursive(leaves, combine, max_leaves=8).map(
        lambda s: s if isinstance(s, dict) else {"allOf": [s]}
    )


PAYLOADS = st.one_of(
    st.dictionaries(KEYS, st.one_of(SHORT, st.integers(-5, 5), st.floats(), JSON), max_size=4),
    JSON,
    DEEP,
)


def _check(validator: PayloadValidator, payload: Any) -> dict[str, list[str]]:
    errors = validator.errors(payload)
    assert isinstance(errors, dict)
    for field, messages in errors.items():
        assert field.startswith("payload"), field
        assert messages and all(isinstance(m, str) and m for m in messages), errors
    return errors


@PROPERTY
@given(st.one_of(schemas(ANY_PATTERNS), JSON, DEEP, st.dictionaries(TEXT, JSON)))
def test_schema_problem_answers_for_any_json(schema):
    problem = schema_problem(schema)
    assert problem is None or (isinstance(problem, str) and problem.endswith("."))
    if problem is None:
        _check(PayloadValidator(schema), {})  # what it accepts compiles (on first use)


@PROPERTY
@given(schemas(ANY_PATTERNS), st.lists(PAYLOADS, min_size=1, max_size=4))
def test_an_accepted_schema_answers_every_payload(schema, payloads):
    assume(schema_problem(schema) is None)
    validator = PayloadValidator(schema)
    for payload in payloads:
        _check(validator, payload)


def _reference_valid(schema: dict[str, Any], payload: Any) -> bool | None:
    """What plain jsonschema says, or None where it cannot answer (an endless or broken $ref)."""
    try:
        return jsonschema.Draft202012Validator(schema).is_valid(payload)
    except (RecursionError, jsonschema.exceptions._RefResolutionError):
        return None


@PROPERTY
@given(
    schemas(st.sampled_from(SAFE_PATTERNS)),
    st.lists(
        st.one_of(
            st.dictionaries(
                KEYS, st.one_of(SHORT, st.integers(-5, 5), st.lists(SHORT)), max_size=4
            ),
            st.recursive(
                st.one_of(st.none(), st.booleans(), st.integers(-9, 9), SHORT),
                lambda inner: (
                    st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3)
                ),
                max_leaves=10,
            ),
        ),
        min_size=1,
        max_size=4,
    ),
)
@example(  # fastjsonschema reads draft 7, where a $ref's siblings were ignored
    schema={"$ref": "#/$defs/d", "$defs": {"d": {}}, "type": "string"}, payloads=[5, "x"]
)
@example(schema={"const": 1, "enum": [1, True]}, payloads=[True, 1, 1.0])
def test_the_validator_agrees_with_jsonschema(schema, payloads):
    assume(schema_problem(schema) is None)
    validator = PayloadValidator(schema)
    for payload in payloads:
        expected = _reference_valid(schema, payload)
        errors = _check(validator, payload)
        if expected is not None:
            assert (errors == {}) == expected, (schema, payload, errors)


# hypothesis-jsonschema 0.23.1 cannot generate objects under this hypothesis
# (its object strategy calls ``many.more()``, gone from hypothesis' internals),
# so objects are built here from its strategies for each property's schema.
SECONDS = {"type": "number", "minimum": 0, "maximum": 86400}
TAGS = {"type": "array", "items": {"type": "string", "pattern": "^[a-z]"}, "uniqueItems": True}
EVIL = {"type": "string", "pattern": "^(a+)+"}
EXTRA = {"type": "integer"}
SLEEPY = {
    "type": "object",
    "required": ["seconds"],
    "properties": {"seconds": SECONDS, "tags": TAGS, "s": EVIL},
    "patternProperties": {"^x-[a-z]+": EXTRA},
    "additionalProperties": False,
}
SLEEPY_PAYLOADS = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries(
        {"seconds": from_schema(SECONDS)},
        optional={"tags": from_schema(TAGS), "s": from_schema(EVIL)},
    ),
    st.dictionaries(st.from_regex(r"x-[a-z]{1,5}", fullmatch=True), from_schema(EXTRA), max_size=2),
)


@PROPERTY
@given(SLEEPY_PAYLOADS)
def test_payloads_generated_from_the_schema_are_accepted(payload):
    assert _check(PayloadValidator(SLEEPY), payload) == {}


@settings(PROPERTY, max_examples=60)
@given(from_schema({"type": "array", "items": EVIL, "maxItems": 3}))
def test_strings_generated_for_a_backtracking_pattern_match_it_on_re2(values):
    validator = PayloadValidator({"type": "object", "properties": {"v": {"items": EVIL}}})
    assert _check(validator, {"v": values}) == {}


def test_the_issue_s_backtracking_pattern_is_linear():
    """Schema regexes run on RE2: 41 a's and a '!' take more than a minute on ``re``."""
    validator = PayloadValidator(
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    )
    started = time.monotonic()
    for n in (41, 1_000, 100_000):
        assert "payload.s" in validator.errors({"s": "a" * n + "!"})
    assert time.monotonic() - started < 2


@pytest.mark.timeout(60)
def test_unique_items_of_objects_is_checked_in_linear_time():
    """jsonschema's own uniqueItems compares every pair of objects: 4,000 took 22 s, and a
    1 MiB payload holds 100,000. (The pattern sends this schema to the jsonschema path.)"""
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+$"},
            "rows": {"type": "array", "uniqueItems": True},
        },
    }
    validator = PayloadValidator(schema)
    rows: list[Any] = [{"a": i, "b": [i, {"c": True}]} for i in range(100_000)]
    assert validator.errors({"name": "x", "rows": rows}) == {}
    errors = validator.errors({"name": "x", "rows": [*rows, {"b": [5, {"c": True}], "a": 5.0}]})
    assert "payload.rows" in errors and "non-unique" in errors["payload.rows"][0]
    assert validator.errors({"rows": [1, True, {"a": 1}, {"a": True}]}) == {}  # true is not 1


def test_a_schema_may_be_as_deep_as_a_payload_and_no_deeper():
    assert MAX_SCHEMA_DEPTH == MAX_DEPTH == 64
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(MAX_SCHEMA_DEPTH - 1):
        schema = {"not": schema}
    assert schema_problem(schema) is None
    assert "nested" in (schema_problem({"not": schema}) or "")


def test_a_local_operation_s_schema_passes_the_same_checks_at_registration():
    """Local schemas run on RE2 too; one RE2 cannot run fails at start-up, not at enqueue."""
    private = OperationRegistry()
    with pytest.raises(InvalidPayloadSchema, match="RE2"):
        operation(
            "unit.backreference",
            payload_schema={"properties": {"s": {"pattern": "(a)\\1"}}},
            target=private,
        )(lambda ctx, payload: None)
    with pytest.raises(InvalidPayloadSchema, match="outside"):
        operation("unit.remote_ref", payload_schema={"$ref": "https://x/y"}, target=private)(
            lambda ctx, payload: None
        )
    assert private.names() == []
    evil = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    operation("unit.evil", payload_schema=evil, target=private)(lambda ctx, payload: None)
    started = time.monotonic()
    assert "payload.s" in private.get("unit.evil").validate({"s": "a" * 41 + "!"})
    assert time.monotonic() - started < 1
