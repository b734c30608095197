"""The dashboard's enqueue form, built from an operation's payload schema.

A flat object schema (properties of type string, integer, number or
boolean, or an enum of plain values) becomes one typed input per property,
required ones marked. Anything else (nested objects, arrays, unions,
references, or no schema at all) gets one JSON textarea prefilled with
``{}``. Beside the payload: queue, priority, an optional run-after time and
optional flow keys (``account:42, region:eu``, added to the operation's own).

Submitting goes through ``jobs.enqueue.enqueue``, the REST API's own path,
and writes the audit row in the same transaction: the enqueue's field
errors come back beside the inputs they concern, and nothing is stored on
error. What the operator typed is checked here first, so no text that
cannot be stored (a NUL, a lone surrogate), no number that is not finite or
beyond 64 bits, and no JSON nested past Python's limits reaches enqueue or
a query; each is an inline error, never an exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from dashboard.inputs import printable
from jobs import audit
from jobs.enqueue import enqueue
from jobs.exceptions import EnqueueError
from jobs.models import PRIORITY_MAX, PRIORITY_MIN, Job
from jobs.operations import validate_against_schema
from jobs.selectors import parse_timestamp
from jobs.selectors.operations import OperationInfo
from jobs.storable import text_problem

SCALAR_TYPES = ("string", "integer", "number", "boolean")
# Keywords a schema may use and still be drawn as typed inputs. Others (allOf,
# $ref, patternProperties, if/then ...) constrain the payload in ways one
# input per property cannot show: those schemas get the JSON textarea.
_OBJECT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "title",
        "description",
        "$schema",
        "$id",
        "$comment",
        "examples",
        "default",
    }
)
_PROPERTY_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "title",
        "description",
        "default",
        "examples",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "$comment",
        "deprecated",
    }
)
# Whole numbers a form accepts: 64 bits, what every JSON reader keeps as an integer.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
MAX_QUEUE_LENGTH = 200
_INTEGER = re.compile(r"[+-]?\d{1,20}")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,5})?")


@dataclass(frozen=True)
class Choice:
    """One option of an enum's select: the index is sent, the label shown."""

    value: str
    label: str


@dataclass
class PayloadInput:
    """One property of a flat schema as an input, with what was sent and what was wrong."""

    key: str  # the property's name in the payload
    name: str  # the form field's name (``p0``, ``p1`` ...): any property name is safe
    kind: str  # string, integer, number, boolean or enum
    required: bool
    help: str = ""
    minimum: str = ""
    maximum: str = ""
    placeholder: str = ""
    choices: list[Choice] = field(default_factory=list)
    options: list[Any] = field(default_factory=list)  # the enum's members, by option index
    value: str = ""
    errors: list[str] = field(default_factory=list)


def _plain_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool) or _plain_number(value)


def _input_for(index: int, key: str, prop: Any, required: bool) -> PayloadInput | None:
    """The input of one property, or None when the property is not a plain value."""
    if not isinstance(prop, dict) or set(prop) - _PROPERTY_KEYWORDS:
        return None
    enum = prop.get("enum")
    kind = prop.get("type")
    if enum is not None:
        if not isinstance(enum, list) or not enum or not all(_scalar(v) for v in enum):
            return None
        kind = "enum"
    elif kind not in SCALAR_TYPES:
        return None
    text = prop.get("description") or prop.get("title") or ""
    made = PayloadInput(
        key=key,
        name=f"p{index}",
        kind=kind,
        required=required,
        help=text if isinstance(text, str) else "",
    )
    if isinstance(enum, list):
        made.options = list(enum)
        made.choices = [
            Choice(str(i), v if isinstance(v, str) else json.dumps(v)) for i, v in enumerate(enum)
        ]
    if kind in ("integer", "number"):
        low, high = prop.get("minimum"), prop.get("maximum")
        made.minimum = str(low) if _plain_number(low) else ""
        made.maximum = str(high) if _plain_number(high) else ""
    default = prop.get("default")
    if kind in ("string", "integer", "number") and _scalar(default) and default is not None:
        made.placeholder = str(default)
    return made


def payload_inputs(schema: Any) -> list[PayloadInput] | None:
    """Typed inputs for a flat object schema, or None for the JSON textarea.

    ``{"type": "object"}`` alone accepts any object: a textarea. An object
    that allows no properties at all (``ping``) is flat, with no inputs.
    """
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None
    if set(schema) - _OBJECT_KEYWORDS:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if not properties and schema.get("additionalProperties") is not False:
        return None
    inputs = []
    for index, (key, prop) in enumerate(properties.items()):
        made = _input_for(index, key, prop, key in required)
        if made is None:
            return None
        inputs.append(made)
    return inputs


@dataclass
class EnqueueForm:
    """The enqueue form of one operation: blank, or bound to what an operator sent."""

    operation: OperationInfo
    inputs: list[PayloadInput] | None  # None: the payload is a JSON textarea
    queue: str = ""
    priority: str = "0"
    run_after: str = ""
    keys: str = ""
    payload: str = "{}"
    errors: dict[str, list[str]] = field(default_factory=dict)  # queue, priority, ... , form
    bound: bool = False

    @classmethod
    def blank(cls, operation: OperationInfo) -> EnqueueForm:
        return cls(operation, payload_inputs(operation.payload_schema), queue=operation.queue)

    @property
    def as_json(self) -> bool:
        return self.inputs is None

    def add_error(self, where: str, message: str) -> None:
        self.errors.setdefault(where, []).append(message)

    @property
    def has_errors(self) -> bool:
        return bool(self.errors) or any(i.errors for i in self.inputs or [])


@dataclass(frozen=True)
class Submission:
    """A bound form's values, ready for ``enqueue``."""

    payload: dict[str, Any]
    queue: str | None
    priority: int
    run_after: datetime | None
    keys: list[str] | None = None


def bind(
    operation: OperationInfo, data: Mapping[str, str]
) -> tuple[EnqueueForm, Submission | None]:
    """Read a submitted form; the request is None when some value was refused (see ``errors``)."""
    form = EnqueueForm.blank(operation)
    form.bound = True
    form.queue = _shown(data.get("queue", ""))
    form.priority = _shown(data.get("priority", ""))
    form.run_after = _shown(data.get("run_after", ""))
    form.keys = _shown(data.get("keys", ""))
    keys = _keys(data.get("keys", ""), form)
    queue = _queue(data.get("queue", ""), form)
    priority = _priority(data.get("priority", ""), form)
    run_after = _run_after(data.get("run_after", ""), form)
    payload: dict[str, Any] | None
    if form.inputs is None:
        form.payload = _shown(data.get("payload", ""))
        payload = _json_payload(data.get("payload", ""), form)
    else:
        payload = {}
        for made in form.inputs:
            raw = data.get(made.name, "")
            made.value = _shown(raw)
            if (parsed := _value(made, raw)) is not _MISSING:
                payload[made.key] = parsed
    if form.has_errors or payload is None:
        if form.inputs and payload is not None:
            # The inputs that were read get their schema errors too: one round shows them all.
            checked = validate_against_schema(payload, operation.payload_schema)
            _place_errors(form, checked, skip_refused=True)
        return form, None
    return form, Submission(
        payload=payload, queue=queue, priority=priority, run_after=run_after, keys=keys
    )


def submit(form: EnqueueForm, submission: Submission, *, user: Any) -> Job | None:
    """Enqueue through the API's path and record who did it; None (with errors) if refused."""
    name = form.operation.name
    try:
        with transaction.atomic():
            job = enqueue(
                name,
                submission.payload,
                queue=submission.queue,
                priority=submission.priority,
                run_after=submission.run_after,
                keys=submission.keys,
            )
            audit.record_action(
                user,
                audit.ENQUEUE,
                target=str(job.pk),
                count=1,
                filters={"operation": name, "queue": job.queue},
            )
    except EnqueueError as error:
        _place_errors(form, error.errors or {"form": [error.message]})
        return None
    return job


# --- reading what was sent ------------------------------------------------------------

_MISSING = object()


def _shown(raw: Any) -> str:
    """A sent value as it may be drawn back into the form (NUL and surrogates replaced)."""
    return printable(raw) if isinstance(raw, str) else ""


def _queue(raw: str, form: EnqueueForm) -> str | None:
    text = raw.strip()
    if reason := text_problem(text):
        form.add_error("queue", f"The queue name {reason}.")
        return None
    if len(text) > MAX_QUEUE_LENGTH:
        form.add_error("queue", f"A queue name is at most {MAX_QUEUE_LENGTH} characters.")
        return None
    return text or None


def _keys(raw: str, form: EnqueueForm) -> list[str] | None:
    """Flow keys typed as a comma-separated list; the enqueue checks each (``jobs.flow_keys``)."""
    if reason := text_problem(raw):
        form.add_error("flow_keys", f"The keys {reason}.")
        return None
    keys = [part.strip() for part in raw.split(",") if part.strip()]
    return keys or None


def _priority(raw: str, form: EnqueueForm) -> int:
    text = raw.strip()
    if not text:
        return 0
    if _INTEGER.fullmatch(text) and PRIORITY_MIN <= int(text) <= PRIORITY_MAX:
        return int(text)
    form.add_error(
        "priority", f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
    )
    return 0


def _run_after(raw: str, form: EnqueueForm) -> datetime | None:
    text = raw.strip()
    if not text:
        return None
    parsed = None if text_problem(text) else parse_timestamp(text)
    if parsed is None:
        form.add_error("run_after", "Write a date and time in UTC, e.g. 2030-01-31T09:30.")
    return parsed


def _whole(text: str) -> int | None:
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if INT_MIN <= value <= INT_MAX else None


def _value(made: PayloadInput, raw: str) -> Any:
    """One input's payload value, ``_MISSING`` when left empty or refused (then with an error)."""
    if reason := text_problem(raw):
        made.errors.append(f"The value {reason}.")
        return _MISSING
    text = raw if made.kind == "string" else raw.strip()
    if text == "":
        return _MISSING  # left out: the schema's "required" says whether that is allowed
    if made.kind == "string":
        return text
    if made.kind == "integer":
        value = _whole(text)
        if value is None:
            made.errors.append("Write a whole number of at most 19 digits, e.g. 42.")
            return _MISSING
        return value
    if made.kind == "number":
        whole = _whole(text)
        if whole is not None:
            return whole
        number = float(text) if len(text) <= 100 and _DECIMAL.fullmatch(text) else None
        if number is None or not math.isfinite(number):
            made.errors.append("Write a finite number, e.g. 2.5.")
            return _MISSING
        return number
    if made.kind == "boolean":
        if text in ("true", "false"):
            return text == "true"
        made.errors.append("Choose true or false.")
        return _MISSING
    index = int(text) if text.isdigit() and len(text) <= 6 else -1
    if not 0 <= index < len(made.options):
        made.errors.append("Choose one of the listed values.")
        return _MISSING
    return made.options[index]


class _Refused(ValueError):
    """The textarea's JSON holds a value no database here stores; the message says which."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number JSON allows: write a finite number.")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused("The payload holds a number too large to store: write a smaller one.")
    return value


def _bounded_int(text: str) -> int:
    value = _whole(text)
    if value is None:
        raise _Refused("The payload holds a whole number beyond 64 bits: write a smaller one.")
    return value


def _json_payload(raw: str, form: EnqueueForm) -> dict[str, Any] | None:
    """The textarea's JSON object, or None with an error on ``payload``."""
    text = raw.strip() or "{}"
    if reason := text_problem(text):
        form.add_error("payload", f"The payload {reason}.")
        return None
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite, parse_int=_bounded_int
        )
    except _Refused as refused:
        form.add_error("payload", str(refused))
        return None
    except RecursionError:
        form.add_error("payload", "The payload is nested too deeply: write a flatter object.")
        return None
    except json.JSONDecodeError as error:
        form.add_error(
            "payload",
            f"The payload is not JSON ({error.msg}, line {error.lineno} column {error.colno}).",
        )
        return None
    if not isinstance(value, dict):
        form.add_error("payload", 'The payload must be a JSON object, e.g. {"account": 42}.')
        return None
    return value


def _place_errors(
    form: EnqueueForm, errors: Mapping[str, list[str]], *, skip_refused: bool = False
) -> None:
    """Put each field error of enqueue beside its input (the rest at the form's top).

    ``skip_refused`` leaves alone inputs that already say why their value was
    refused (it was left out of the payload, so "required" would mislead).
    """
    by_key = sorted(form.inputs or [], key=lambda i: len(i.key), reverse=True)
    refused = {i.name for i in by_key if i.errors} if skip_refused else set()
    for path, messages in errors.items():
        texts = [printable(str(m)) for m in messages]
        target = next(
            (
                i
                for i in by_key
                if path == f"payload.{i.key}" or path.startswith(f"payload.{i.key}.")
            ),
            None,
        )
        if target is not None:
            if target.name not in refused:
                target.errors.extend(texts)
        elif path == "payload" or path.startswith("payload."):
            for text in texts:
                form.add_error("payload", text if path == "payload" else f"{path}: {text}")
        elif path in ("queue", "priority", "run_after"):
            form.errors.setdefault(path, []).extend(texts)
        elif path == "keys":  # "flow_keys" in the form: a template reads errors.keys as the method
            form.errors.setdefault("flow_keys", []).extend(texts)
        else:
            form.errors.setdefault("form", []).extend(texts)
