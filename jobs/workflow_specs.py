"""A workflow written as JSON (the REST API, schedules) checked into a ``WorkflowBuilder``.

The shape::

    {"name": "nightly", "on_failure": "cancel",
     "steps": [
        {"name": "fetch", "operation": "fetch", "payload": {...}},
        {"name": "merge", "operation": "merge",
         "depends_on": ["fetch", {"step": "other", "on_failure": "run"}, "<job id>"],
         "queue": "...", "priority": 0, "max_attempts": 3, "timeout_seconds": 60,
         "keys": ["account:{account}"], "on_failure": "hold"}]}

Every problem is reported by field (``steps.1.depends_on``), in the API's
error shape, and nothing is stored (``start_workflow``).
"""

from __future__ import annotations

import uuid
from typing import Any

from jobs.dependencies import After
from jobs.exceptions import EnqueueError
from jobs.models import OnFailure, Workflow
from jobs.workflows import MAX_STEPS, WorkflowBuilder

STEP_OPTIONS = ("queue", "priority", "max_attempts", "timeout_seconds", "keys")
STEP_FIELDS = frozenset({"name", "operation", "payload", "depends_on", "on_failure", *STEP_OPTIONS})
TOP_FIELDS = frozenset({"name", "on_failure", "steps"})


def builder_from_spec(spec: Any) -> WorkflowBuilder:
    """The builder ``spec`` describes, or ``EnqueueError`` naming every field in error."""
    errors: dict[str, list[str]] = {}
    if not isinstance(spec, dict):
        raise EnqueueError(
            "The workflow must be a JSON object.", {"non_field_errors": ["Expected an object."]}
        )
    for name in sorted(set(spec) - TOP_FIELDS):
        errors[name] = [f"Unknown field {name!r}."]
    name = spec.get("name", "")
    if not isinstance(name, str):
        errors["name"] = ["The name must be a string."]
    on_failure = spec.get("on_failure", OnFailure.CANCEL.value)
    if on_failure not in OnFailure.values:
        errors["on_failure"] = [f"on_failure must be one of {', '.join(OnFailure.values)}."]
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        errors["steps"] = ["steps must be a non-empty list of steps."]
    elif len(steps) > MAX_STEPS:
        errors["steps"] = [f"A workflow has at most {MAX_STEPS} steps."]
    if errors:
        raise EnqueueError(
            "The workflow was not enqueued: fix the fields named in 'errors'.", errors
        )
    assert isinstance(steps, list)  # checked above
    builder = WorkflowBuilder(name=name, on_failure=on_failure)
    for index, step in enumerate(steps):
        try:
            _add_step(builder, index, step)
        except EnqueueError as error:
            for field, messages in error.errors.items():
                errors.setdefault(f"steps.{index}.{field}", []).extend(messages)
    for index, step in enumerate(builder.steps):
        for target in step["depends_on"]:
            name = target.job if isinstance(target, After) else target
            if isinstance(name, str) and name not in builder.step_names and not _is_uuid(name):
                errors.setdefault(f"steps.{index}.depends_on", []).append(
                    f"No step is named {name!r}."
                )
    if errors:
        raise EnqueueError(
            "The workflow was not enqueued: fix the fields named in 'errors'.", errors
        )
    return builder


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _add_step(builder: WorkflowBuilder, index: int, step: Any) -> None:
    if not isinstance(step, dict):
        raise EnqueueError(
            "A step must be an object.", {"non_field_errors": ["Expected an object."]}
        )
    unknown = sorted(set(step) - STEP_FIELDS)
    if unknown:
        raise EnqueueError("Unknown fields.", {u: [f"Unknown field {u!r}."] for u in unknown})
    operation = step.get("operation")
    if not isinstance(operation, str) or not operation:
        raise EnqueueError("No operation.", {"operation": ["Name the step's operation."]})
    depends_on = step.get("depends_on", [])
    if not isinstance(depends_on, list):
        raise EnqueueError("Bad depends_on.", {"depends_on": ["depends_on must be a list."]})
    builder.step(
        operation,
        step.get("payload", {}),
        name=step.get("name") or f"step-{index + 1}",
        depends_on=[_dependency(d) for d in depends_on],
        on_failure=step.get("on_failure"),
        **{k: step[k] for k in STEP_OPTIONS if k in step},
    )


def _dependency(value: Any) -> Any:
    """A step name, a job id, or ``{"step": name or id, "on_failure": policy}``."""
    if isinstance(value, dict):
        target = value.get("step", value.get("job"))
        return After(_dependency(target), value.get("on_failure"))
    if isinstance(value, str):
        return value
    raise EnqueueError(
        "Bad dependency.",
        {"depends_on": ['Each dependency is a step\'s name, a job id, or {"step", "on_failure"}.']},
    )


def start_workflow(
    spec: Any, *, schedule: uuid.UUID | None = None, using: str = "default"
) -> Workflow:
    """Check ``spec`` and enqueue it as one workflow (all its steps, one transaction)."""
    builder = builder_from_spec(spec)
    try:
        return builder.enqueue(schedule=schedule, using=using)
    except EnqueueError as error:
        raise EnqueueError(str(error), _by_step(error.errors, len(builder.steps))) from None


def _by_step(errors: dict[str, list[str]], steps: int) -> dict[str, list[str]]:
    """``enqueue_many``'s ``3.payload`` as ``steps.3.payload`` (a lone step's ``payload`` too)."""
    out: dict[str, list[str]] = {}
    for field, messages in errors.items():
        head, _, rest = field.partition(".")
        if head.isdigit() and rest:
            key = f"steps.{field}"
        else:
            key = f"steps.0.{field}" if steps == 1 and field != "steps" else field
        out.setdefault(key, []).extend(messages)
    return out
