"""The schedules page's "New schedule" form: what the operator typed, read into
``create_schedule``'s values, and the errors it answered, field by field.

An operation with its payload, or a workflow's JSON (``jobs.workflow_specs``'
shape) in its own textarea: exactly one of the two, as the API takes them.
A workflow's errors name their step (``steps.1.depends_on: …``) beside it.

The checks themselves are ``jobs.schedules.definitions.check_definition``'s
(the API's too): this module only turns form text into JSON-like values
(numbers, an object) and puts each error beside its input. What was typed
stays in the form when it is drawn again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.http import QueryDict

from jobs.models import CatchUp, Overlap

# The inputs, in the order the form shows them.
FIELDS = (
    "operation",
    "workflow",
    "name",
    "cron",
    "every_seconds",
    "timezone",
    "payload",
    "queue",
    "priority",
    "catch_up",
    "overlap",
)
# Characters; the definition checks the payload's bytes after parsing.
LIMITS = {"payload": 100_000, "workflow": 1_000_000}
JSON_HINTS = {
    "payload": 'Write a JSON object, for example {"account": 42}.',
    "workflow": 'Write a JSON object, for example {"steps": [{"operation": "ping"}]}.',
}


@dataclass
class ScheduleForm:
    """The form's text and its errors (``form`` holds those no single input owns)."""

    values: dict[str, str] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def blank(cls) -> ScheduleForm:
        return cls(
            values={
                "timezone": "UTC",
                "priority": "0",
                "catch_up": CatchUp.ONE.value,
                "overlap": Overlap.ALLOW.value,
            }
        )

    @property
    def bound(self) -> bool:
        return bool(self.errors)

    def add(self, name: str, message: str) -> None:
        key = name if name in FIELDS else "form"
        text = message if key != "form" or name in ("", "form") else f"{name}: {message}"
        self.errors.setdefault(key, []).append(text)

    def add_all(self, errors: dict[str, list[str]]) -> None:
        for name, messages in errors.items():
            within = name.partition(".")[2] if name.startswith("workflow.") else ""
            for message in messages:
                self.add(_field_of(name), f"{within}: {message}" if within else str(message))


def _field_of(name: str) -> str:
    """``payload.account`` (an operation's schema) belongs beside the payload input."""
    head = name.split(".", 1)[0].split("[", 1)[0]
    return head if head in FIELDS else name


def bind(post: QueryDict) -> tuple[ScheduleForm, dict[str, Any] | None]:
    """The form as typed, and ``create_schedule``'s values (None when some text is unreadable).

    Empty inputs are left out, so the definition's defaults apply (a name
    made from the operation, UTC, priority 0, catch-up ``one``).
    """
    form = ScheduleForm(values={name: str(post.get(name, ""))[:10_000] for name in FIELDS})
    values: dict[str, Any] = {}
    for name in ("operation", "name", "cron", "timezone", "queue", "catch_up", "overlap"):
        text = form.values[name].strip()
        if text:
            values[name] = text
    every = form.values["every_seconds"].strip()
    if every:
        try:
            values["every_seconds"] = float(every)
        except ValueError:
            form.add("every_seconds", "Write the interval as a number of seconds, e.g. 300.")
    priority = form.values["priority"].strip()
    if priority:
        try:
            values["priority"] = int(priority)
        except ValueError:
            form.add("priority", "Priority must be a whole number from -100 to 100.")
    for name, hint in JSON_HINTS.items():
        text = str(post.get(name, ""))
        form.values[name] = text[: LIMITS[name]]
        if len(text) > LIMITS[name]:
            form.add(name, f"The {name} is longer than {LIMITS[name]:,} characters.")
        elif text.strip():
            try:
                values[name] = json.loads(text, parse_constant=_refuse_constant)
            except (ValueError, RecursionError):
                form.add(name, hint)
    return form, (None if form.errors else values)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
