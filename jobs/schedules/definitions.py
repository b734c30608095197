"""A schedule's definition, checked once for every way in: the API, settings, decorators.

``check_definition`` merges the given values over a base (a PATCH) or the
defaults (a new schedule) and checks the result as a whole, collecting every
field's problem at once: exactly one of ``operation`` and ``workflow``; the
operation exists (``jobs.operations.operation_spec``, remote-declared ones
included), the payload is storable JSON that passes the operation's schema
(as at enqueue); or the workflow's steps would start as they are
(``jobs.schedules.workflow_check``, errors under ``workflow.steps.N.field``),
with no payload, queue or priority of the schedule's own; exactly one of ``cron`` and
``every_seconds``, a known time zone, a priority in range, known
``catch_up`` and ``overlap`` policies, and no NUL or lone surrogate in text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from jobs.conf import knob
from jobs.exceptions import ControlPlaneError, EnqueueError
from jobs.models import PRIORITY_MAX, PRIORITY_MIN, CatchUp, Overlap
from jobs.operations import operation_spec
from jobs.schedules.timing import (
    Timing,
    TimingError,
    check_every_seconds,
    normalise_cron,
    zone,
)
from jobs.schedules.workflow_check import workflow_problems
from jobs.storable import first_unstorable, text_problem

MAX_NAME_LENGTH = 200
# What PATCH may change; the name and the operation stay (make a new schedule instead).
# A workflow schedule's workflow may change; a job schedule does not become one.
EDITABLE = (
    "workflow",
    "payload",
    "queue",
    "priority",
    "cron",
    "every_seconds",
    "timezone",
    "catch_up",
    "overlap",
)
TIMING_FIELDS = ("cron", "every_seconds", "timezone")


class ScheduleInvalid(ControlPlaneError):
    """A schedule definition was refused; ``errors`` maps each field to its messages."""

    def __init__(self, errors: dict[str, list[str]], message: str = "") -> None:
        self.errors = errors
        self.message = message or "The schedule was not saved: fix the fields named in 'errors'."
        super().__init__(self.message)


@dataclass(frozen=True)
class Definition:
    """What a schedule does and when: the checked values of a ``Schedule`` row."""

    name: str
    operation: str  # "" for a workflow schedule
    payload: dict[str, Any] = field(default_factory=dict)
    workflow: dict[str, Any] | None = None
    queue: str | None = None
    priority: int = 0
    cron: str = ""
    every_seconds: float | None = None
    timezone: str = "UTC"
    catch_up: str = CatchUp.ONE.value
    overlap: str = Overlap.ALLOW.value

    @property
    def timing(self) -> Timing:
        return Timing(self.cron, self.every_seconds, self.timezone)

    @classmethod
    def of(cls, schedule: Any) -> Definition:
        """The definition a ``Schedule`` row holds."""
        return cls(**{f.name: getattr(schedule, f.name) for f in fields(cls)})

    def values(self) -> dict[str, Any]:
        """The row's columns, for ``Schedule.objects.create(**…)`` or an update."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def default_name(operation: str) -> str:
    """A unique-enough name for a schedule created without one: ``<operation>-<8 hex>``."""
    return f"{operation[: MAX_NAME_LENGTH - 9]}-{uuid.uuid4().hex[:8]}"


def _text(
    errors: dict[str, list[str]], name: str, value: Any, *, label: str, limit: int = 200
) -> str | None:
    if not isinstance(value, str) or not value.strip():
        errors[name] = [f"The {label} must be a non-empty string."]
        return None
    if len(value) > limit:
        errors[name] = [f"The {label} is longer than {limit} characters."]
        return None
    if reason := text_problem(value):
        errors[name] = [f"The {label} {reason}."]
        return None
    return value


def _merge_timing(values: Mapping[str, Any], base: Definition | None) -> tuple[Any, Any]:
    """(cron, every_seconds) after a change: setting one clears the other."""
    cron = values.get("cron", base.cron if base else "")
    every = values.get("every_seconds", base.every_seconds if base else None)
    if base is not None:
        if values.get("cron") and "every_seconds" not in values:
            every = None
        elif values.get("every_seconds") is not None and "cron" not in values:
            cron = ""
    return ("" if cron is None else cron), every


def check_definition(values: Mapping[str, Any], *, base: Definition | None = None) -> Definition:
    """The definition ``values`` describe, merged over ``base`` when given (a change).

    Raises ``ScheduleInvalid`` naming every field that is wrong.
    """
    errors: dict[str, list[str]] = {}
    unknown = sorted(set(values) - {f.name for f in fields(Definition)})
    for key in unknown:
        errors[str(key)[:60]] = ["This field is not known."]
    merged: dict[str, Any] = base.values() if base else {}
    merged.update({k: v for k, v in values.items() if k not in unknown})

    workflow = merged.get("workflow")
    operation: str | None = ""
    if workflow is not None:
        _check_workflow_schedule(errors, merged, base)
    elif base is not None and base.workflow is not None:
        errors["workflow"] = ["A workflow schedule keeps a workflow: give its new steps."]
    elif merged.get("operation") in (None, "") and base is None:
        errors["operation"] = [
            "Give operation (an operation's name) or workflow (a workflow's steps as JSON)."
        ]
    else:
        operation = _text(errors, "operation", merged.get("operation"), label="operation name")
    given_name = merged.get("name")
    if given_name is None and base is None and operation:
        given_name = default_name(operation)
    elif given_name is None and base is None and workflow is not None:
        named = workflow.get("name") if isinstance(workflow, dict) else None
        given_name = default_name(named if isinstance(named, str) and named else "workflow")
    name = _text(errors, "name", given_name, label="schedule name", limit=MAX_NAME_LENGTH)

    spec = None
    if operation:
        try:
            spec = operation_spec(operation)
        except EnqueueError as error:
            errors.update(error.errors or {"operation": [error.message]})

    payload = merged.get("payload")
    payload = {} if payload is None else payload
    if workflow is not None:
        pass  # refused by _check_workflow_schedule unless empty
    elif not isinstance(payload, dict):
        errors["payload"] = ["The payload must be a JSON object."]
    elif found := first_unstorable(payload, "payload"):
        errors[found[0]] = [f"The value {found[1]}."]
    else:
        size = len(json.dumps(payload, ensure_ascii=False).encode())
        limit = int(knob("MAX_PAYLOAD_BYTES"))
        if size > limit:
            errors["payload"] = [f"The payload is {size} bytes; the limit is {limit} bytes."]
        elif spec is not None:
            errors.update(spec.validate(payload))

    queue = merged.get("queue")
    if queue is not None:
        queue = _text(errors, "queue", queue, label="queue name")

    priority = merged.get("priority", 0)
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not PRIORITY_MIN <= priority <= PRIORITY_MAX
    ):
        errors["priority"] = [
            f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        ]

    cron, every = _merge_timing(values, base)
    if cron and every is not None:
        errors["cron"] = ["Give either cron or every_seconds, not both."]
    elif not cron and every is None:
        errors["cron"] = ["Give cron (a cron expression) or every_seconds (an interval)."]
    else:
        try:
            if cron:
                cron = normalise_cron(cron)
            else:
                every = check_every_seconds(every)
        except TimingError as error:
            errors[error.field] = [str(error)]

    timezone_name = merged.get("timezone", "UTC")
    try:
        zone(timezone_name)
    except TimingError as error:
        errors[error.field] = [str(error)]

    policies = {"catch_up": (CatchUp, CatchUp.ONE.value), "overlap": (Overlap, Overlap.ALLOW.value)}
    for key, (choices, default) in policies.items():
        value = merged.setdefault(key, default)
        if not isinstance(value, str) or value not in choices.values:
            errors[key] = [f"{key} must be one of {', '.join(choices.values)}."]

    if errors:
        raise ScheduleInvalid(errors)
    assert operation is not None and name is not None
    return replace(
        Definition(name=name, operation=operation),
        payload=payload,
        workflow=workflow,
        queue=queue,
        priority=priority,
        cron=cron,
        every_seconds=every,
        timezone=timezone_name,
        catch_up=merged["catch_up"],
        overlap=merged["overlap"],
    )


def _check_workflow_schedule(
    errors: dict[str, list[str]],
    merged: Mapping[str, Any],
    base: Definition | None,
) -> None:
    """A workflow schedule: no operation, payload, queue or priority of its own; its
    workflow would start as it is (``workflow_problems``)."""
    if base is not None and base.workflow is None:
        errors["workflow"] = [
            "A schedule of an operation cannot become a workflow schedule: create a new schedule."
        ]
        return
    if merged.get("operation") not in (None, ""):
        errors["workflow"] = ["Give either operation or workflow, not both."]
        return
    own = {
        "payload": merged.get("payload") not in (None, {}),
        "queue": merged.get("queue") is not None,
        "priority": merged.get("priority", 0) != 0,
    }
    for key, given in own.items():
        if given:
            errors[key] = [f"A workflow schedule has no {key} of its own: set it on each step."]
    errors.update(workflow_problems(merged.get("workflow")))
