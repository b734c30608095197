"""``jobs.schema_precheck`` vouches only for schemas the Draft 2020-12 metaschema accepts.

Registration trusts its True without asking jsonschema (a worker's start-up
then never imports it), so a wrong True would let a malformed schema through
to the first enqueue. Its keyword tables are held to the metaschema that
jsonschema ships, and a property test feeds it every keyword with values of
right and wrong shapes: whenever it says True, jsonschema agrees.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema_specifications import REGISTRY

from jobs import diagnostics
from jobs.operations import registry, schema_problem
from jobs.schema_precheck import (
    LEFT_TO_JSONSCHEMA,
    SCHEMA_KEYWORDS,
    SCHEMA_LIST_KEYWORDS,
    SCHEMA_MAP_KEYWORDS,
    VALUE_KEYWORDS,
    known_valid,
)
from jobs.schema_validator import NO_FORMATS

META = "https://json-schema.org/draft/2020-12/"
VOCABULARIES = ("core", "applicator", "unevaluated", "validation")
VOCABULARIES += ("meta-data", "format-annotation", "content")
ALL_KEYWORDS = sorted(
    SCHEMA_KEYWORDS | SCHEMA_LIST_KEYWORDS | SCHEMA_MAP_KEYWORDS | set(VALUE_KEYWORDS)
)


def metaschema_keywords() -> dict[str, Any]:
    """Every keyword the 2020-12 metaschema names, with what it asks of the keyword's value."""
    keywords = dict(REGISTRY.contents(f"{META}schema")["properties"])
    for vocabulary in VOCABULARIES:
        keywords.update(REGISTRY.contents(f"{META}meta/{vocabulary}")["properties"])
    return keywords


def metaschema_accepts(schema: Any) -> bool:
    try:
        jsonschema.Draft202012Validator.check_schema(schema, format_checker=NO_FORMATS)
    except jsonschema.SchemaError:
        return False
    return True


def test_the_keyword_tables_are_the_metaschema_s_keywords() -> None:
    named = metaschema_keywords()
    tables = [SCHEMA_KEYWORDS, SCHEMA_LIST_KEYWORDS, SCHEMA_MAP_KEYWORDS, set(VALUE_KEYWORDS)]
    tables.append(LEFT_TO_JSONSCHEMA)
    assert sorted(set().union(*tables)) == sorted(named)
    assert sum(len(table) for table in tables) == len(named)  # each keyword in one table
    for keyword in SCHEMA_KEYWORDS:
        assert named[keyword] == {"$dynamicRef": "#meta"}, keyword
    for keyword in SCHEMA_LIST_KEYWORDS:
        assert named[keyword] == {"$ref": "#/$defs/schemaArray"}, keyword
    for keyword in SCHEMA_MAP_KEYWORDS:
        assert named[keyword]["type"] == "object", keyword
        assert named[keyword]["additionalProperties"] == {"$dynamicRef": "#meta"}, keyword


def test_the_built_in_operations_need_no_jsonschema_to_register() -> None:
    assert diagnostics.ping is not None  # registered on import
    for name in ("ping", "sleep", "fail", "retry_later", "fanout"):
        assert known_valid(registry.get(name).payload_schema), name


def test_malformed_schemas_are_left_to_jsonschema() -> None:
    malformed = [
        {"type": "no-such-type"},
        {"type": []},
        {"type": ["string", "string"]},
        {"required": ["a", "a"]},
        {"required": "a"},
        {"minimum": "1"},
        {"minLength": -1},
        {"maxItems": True},
        {"multipleOf": 0},
        {"properties": []},
        {"properties": {"a": 3}},
        {"allOf": []},
        {"items": 3},
        {"not": {"enum": "a"}},
        {"dependentRequired": {"a": "b"}},
        {"$defs": {"d": {"uniqueItems": "yes"}}},
    ]
    for schema in malformed:
        assert not known_valid(schema), schema
        assert not metaschema_accepts(schema), schema
        assert (schema_problem(schema) or "").startswith("The payload schema is not valid"), schema


def test_keywords_it_leaves_out_go_to_jsonschema_even_when_valid() -> None:
    assert not known_valid({"$id": "https://example.com/s", "type": "object"})
    assert not known_valid({"properties": {"a": {"$anchor": "a"}}})
    assert schema_problem({"$id": "https://example.com/s", "type": "object"}) is None


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.sampled_from([0.0, 2.0, 0.5, -1.5, float("nan")]),
    st.sampled_from(["string", "object", "integer", "no-such-type", "", "#/$defs/d"]),
    st.lists(st.sampled_from(["a", "b", "string", "integer", 1, None]), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from([["a"], ["a", "a"], "a", 1])),
)


# Values of the right shape for each kind of keyword, near the edges of what it allows.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "type": st.sampled_from(["string", "null", ["string", "null"], ["integer"]]),
    "count": st.sampled_from([0, 1, 3, 2.0]),
    "number": st.sampled_from([0, -1, 2.5, 1e-9]),
    "strings": st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3),
    "text": st.sampled_from(["", "a", "#/$defs/a", "^a+$"]),
}


def plausible(keyword: str, inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    if keyword in SCHEMA_KEYWORDS:
        return inner
    if keyword in SCHEMA_LIST_KEYWORDS:
        return st.lists(inner, min_size=1, max_size=2)
    if keyword in SCHEMA_MAP_KEYWORDS:
        return st.dictionaries(st.sampled_from(["a", "b", "^a"]), inner, max_size=2)
    if keyword == "type":
        return PLAUSIBLE["type"]
    if keyword.startswith(("min", "max")) and not keyword.endswith("imum"):
        return PLAUSIBLE["count"]
    if keyword in ("required", "enum", "examples"):
        return PLAUSIBLE["strings"]
    if keyword == "dependentRequired":
        return st.dictionaries(st.sampled_from(["a", "b"]), PLAUSIBLE["strings"], max_size=2)
    if keyword.endswith(("imum", "multipleOf")):
        return PLAUSIBLE["number"]
    if keyword in ("uniqueItems", "deprecated", "readOnly", "writeOnly"):
        return st.booleans()
    return PLAUSIBLE["text"]


def keyword_soup() -> st.SearchStrategy[Any]:
    """Schemas of every keyword the precheck knows (and some it does not), with values of
    the right shape most of the time and of any shape otherwise."""
    keys = [*ALL_KEYWORDS, *sorted(LEFT_TO_JSONSCHEMA), "x-extra"]

    def value(keyword: str, inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        wrong = st.one_of(VALUES, inner, st.lists(inner, max_size=2))
        return st.one_of(*[plausible(keyword, inner)] * 5, wrong)  # one in six is wrong

    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        chosen = st.lists(st.sampled_from(keys), unique=True, max_size=4)
        return chosen.flatmap(lambda ks: st.fixed_dictionaries({k: value(k, inner) for k in ks}))

    return st.recursive(st.one_of(st.booleans(), st.just({})), extend, max_leaves=10)


@settings(
    max_examples=2000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(keyword_soup())
def test_whatever_it_vouches_for_the_metaschema_accepts(schema: Any) -> None:
    if known_valid(schema):
        assert metaschema_accepts(schema), schema
