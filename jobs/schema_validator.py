"""The full payload validator: jsonschema's Draft 2020-12 with regexes on RE2.

Loaded only when a payload needs field errors (the fast path refused it, or
the schema cannot take the fast path) or a schema needs the metaschema
check that ``jobs.schema_precheck`` cannot vouch for. ``jsonschema`` and
what it pulls in (referencing, attrs, rpds, the bundled metaschemas) were
about a fifth of a worker's imports; a worker that enqueues nothing never
loads this module.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import jsonschema
import referencing.exceptions

from jobs.schema_regex import pattern_matches

__all__ = ["RE2Draft202012Validator", "field_errors", "metaschema_problem"]


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not pattern_matches(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if pattern_matches(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(pattern_matches(p, key) for p in patterns)
    ]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif not additional and extras:
        listed = ", ".join(repr(key) for key in sorted(extras))
        if patterns:
            regexes = ", ".join(repr(p) for p in sorted(patterns))
            yield jsonschema.ValidationError(
                f"{listed} {'does' if len(extras) == 1 else 'do'} not match any of the "
                f"regexes: {regexes}"
            )
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield jsonschema.ValidationError(
                f"Additional properties are not allowed ({listed} {verb} unexpected)"
            )


def _comparable(value: Any) -> Hashable:
    """A hashable form of a JSON value under JSON Schema's equality: ``1 == 1.0``,
    ``true != 1``, objects compared without regard to key order."""
    if isinstance(value, dict):
        return frozenset((key, _comparable(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_comparable(item) for item in value)
    if isinstance(value, bool):
        return (bool, value)
    return value


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """``uniqueItems`` in linear time. jsonschema's own falls back to comparing every pair
    when items are objects: 4,000 of them took 22 s, and a 1 MiB payload holds 100,000."""
    if unique and validator.is_type(instance, "array"):
        seen: set[Hashable] = set()
        for item in instance:
            key = _comparable(item)
            if key in seen:
                shown = repr(item)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                yield jsonschema.ValidationError(f"has non-unique elements ({shown} repeats)")
                return
            seen.add(key)


# Draft 2020-12 with every regex keyword on RE2, and uniqueItems in linear
# time. (``unevaluatedProperties`` next to ``patternProperties`` would match
# on Python's ``re``: refused by ``schema_problem``.)
RE2Draft202012Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "uniqueItems": _unique_items,
    },
)
# The metaschema check without format checks: the "regex" format would
# compile patterns with Python's ``re``; ``schema_problem`` compiles them with
# RE2, the engine that runs them, and says why one is refused.
NO_FORMATS = jsonschema.FormatChecker(formats=())


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def metaschema_problem(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not valid Draft 2020-12, as a sentence; or None."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema, format_checker=NO_FORMATS)
    except jsonschema.SchemaError as error:
        where = "".join(f"[{p!r}]" for p in error.absolute_path)
        return (
            f"The payload schema is not valid JSON Schema (draft 2020-12): "
            f"{_shorten(error.message, 300)}{f' at {where}' if where else ''}."
        )
    return None


def _path_order(error: jsonschema.ValidationError) -> list[tuple[bool, Any]]:
    """Sort key of an error's path that never compares a key with an index."""
    return [(isinstance(p, str), p) for p in error.path]


def field_errors(validator: Any, payload: Any) -> dict[str, list[str]]:
    """Field errors of ``payload`` from an ``RE2Draft202012Validator`` (``payload.<path>``)."""
    try:
        found = sorted(validator.iter_errors(payload), key=_path_order)
    except RecursionError:
        return {
            "payload": [
                "The payload could not be checked: the operation's schema refers to "
                "itself without reaching the payload's end. Fix the schema's $ref."
            ]
        }
    except referencing.exceptions.Unresolvable as unresolvable:
        return {
            "payload": [
                f"The payload could not be checked: the operation's schema has a "
                f"reference that cannot be resolved ({_shorten(str(unresolvable), 200)})."
            ]
        }
    errors: dict[str, list[str]] = {}
    for error in found:
        path = "payload" + "".join(f".{p}" for p in error.absolute_path)
        if error.validator == "required":
            missing = error.message.split("'")[1] if "'" in error.message else ""
            path = f"{path}.{missing}" if missing else path
        errors.setdefault(path, []).append(error.message)
    return errors
