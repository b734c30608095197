"""A payload schema known valid against the Draft 2020-12 metaschema, without jsonschema.

Every operation's schema is checked against the metaschema when it
registers, so a malformed one fails at start-up, not at the first enqueue.
``jsonschema`` with what it pulls in (referencing, attrs, rpds, the bundled
metaschemas, the format checkers) was about a fifth of a worker's imports,
and a worker never needs it otherwise: it validates no payloads unless an
operation enqueues. Real schemas use a handful of keywords with values of
plain shapes; this module vouches for those in a few microseconds, so
``jobs.operations.schema_problem`` loads jsonschema only for the rest.

``known_valid`` answers True only where the metaschema surely passes. False
means "ask jsonschema", which has the final word and the error message.
Keywords the metaschema does not name are allowed with any value, as in
the metaschema itself; ``tests/unit/test_schema_precheck.py`` holds the
keyword tables below to the metaschema jsonschema ships.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["known_valid"]

SIMPLE_TYPES = frozenset({"array", "boolean", "integer", "null", "number", "object", "string"})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    """A non-negative integer (floats such as 2.0 are left to jsonschema)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _is_array(value: Any) -> bool:
    return isinstance(value, list)


def _is_anything(value: Any) -> bool:
    return True


def _is_unique_strings(value: Any) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(item, str) for item in value)
        and len(set(value)) == len(value)
    )


def _is_type(value: Any) -> bool:
    if isinstance(value, str):
        return value in SIMPLE_TYPES
    return _is_unique_strings(value) and bool(value) and all(item in SIMPLE_TYPES for item in value)


def _is_positive_number(value: Any) -> bool:
    return _is_number(value) and value > 0


def _is_map_of_unique_strings(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(key, str) and _is_unique_strings(item) for key, item in value.items()
    )


# Keywords whose value is a schema, a non-empty list of schemas, or an object of schemas.
SCHEMA_KEYWORDS = frozenset(
    {
        "items",
        "contains",
        "additionalProperties",
        "propertyNames",
        "if",
        "then",
        "else",
        "not",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
SCHEMA_LIST_KEYWORDS = frozenset({"prefixItems", "allOf", "anyOf", "oneOf"})
SCHEMA_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
)
# Keywords whose value is not a schema: what the metaschema asks of it.
VALUE_KEYWORDS: dict[str, Callable[[Any], bool]] = {
    "type": _is_type,
    "const": _is_anything,
    "default": _is_anything,
    "enum": _is_array,
    "examples": _is_array,
    "multipleOf": _is_positive_number,
    "maximum": _is_number,
    "exclusiveMaximum": _is_number,
    "minimum": _is_number,
    "exclusiveMinimum": _is_number,
    "maxLength": _is_count,
    "minLength": _is_count,
    "maxItems": _is_count,
    "minItems": _is_count,
    "maxContains": _is_count,
    "minContains": _is_count,
    "maxProperties": _is_count,
    "minProperties": _is_count,
    "required": _is_unique_strings,
    "dependentRequired": _is_map_of_unique_strings,
    "uniqueItems": _is_boolean,
    "deprecated": _is_boolean,
    "readOnly": _is_boolean,
    "writeOnly": _is_boolean,
    # No format checker runs on the metaschema (see ``schema_problem``), so
    # "regex" and "uri-reference" formats ask only for a string here.
    "pattern": _is_string,
    "$ref": _is_string,
    "$comment": _is_string,
    "title": _is_string,
    "description": _is_string,
    "format": _is_string,
    "contentEncoding": _is_string,
    "contentMediaType": _is_string,
}
# Keywords the metaschema names that this module leaves to jsonschema: their
# values carry patterns or formats of their own, or they are rare.
LEFT_TO_JSONSCHEMA = frozenset(
    {
        "$id",
        "$schema",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$vocabulary",
        "$recursiveRef",
        "$recursiveAnchor",
        "dependencies",
    }
)


def known_valid(schema: Any) -> bool:
    """True only if ``schema`` surely passes the Draft 2020-12 metaschema.

    Walks the schema with a stack, not recursion; callers bound its depth
    (``schema_problem`` refuses deeper schemas before asking).
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return False
        for keyword, value in node.items():
            if keyword in SCHEMA_KEYWORDS:
                stack.append(value)
            elif keyword in SCHEMA_LIST_KEYWORDS:
                if not isinstance(value, list) or not value:
                    return False
                stack.extend(value)
            elif keyword in SCHEMA_MAP_KEYWORDS:
                if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                    return False
                stack.extend(value.values())
            elif keyword in VALUE_KEYWORDS:
                if not VALUE_KEYWORDS[keyword](value):
                    return False
            elif keyword in LEFT_TO_JSONSCHEMA or not isinstance(keyword, str):
                return False
    return True
