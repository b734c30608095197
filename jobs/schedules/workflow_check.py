"""A schedule's workflow checked when the schedule is saved, as it would be when it fires.

``jobs.workflow_specs.builder_from_spec`` reads the JSON's shape (fields,
step names, dependencies named). What the fire's ``start_workflow`` checks
next, before storing anything, is checked here too without storing
anything: each step's operation exists and its payload passes the
operation's schema (``jobs.job_spec.prepare_row``, the enqueue's own row
check), its options are in range, its dependencies name steps of the
workflow (or job ids) and make no cycle (``jobs.dependencies.plan_links``).
A schedule is therefore refused at create or update, field by field under
``workflow.…``, rather than failing every slot at fire time. What can still
fail at fire time is what changes in between (an operation removed from
the code, a job id named in ``depends_on`` deleted): that fire is recorded
``enqueue_failed``, as for a job schedule. ``manage.py workflow start``
checks a file with it too (``prefix=""``), for the same field names.
"""

from __future__ import annotations

import uuid
from typing import Any

from jobs.clock import db_now
from jobs.conf import knob
from jobs.dependencies import After, plan_links
from jobs.exceptions import EnqueueError
from jobs.job_spec import JobSpec, SpecBatch, prepare_row
from jobs.storable import first_unstorable, text_problem
from jobs.workflow_specs import builder_from_spec
from jobs.workflows import MAX_NAME_LENGTH, WorkflowBuilder

PREFIX = "workflow"


def workflow_problems(spec: Any, prefix: str = PREFIX) -> dict[str, list[str]]:
    """Every problem of the workflow JSON ``spec``, by field (``workflow.steps.1.payload``;
    ``steps.1.payload`` with ``prefix=""``). Empty when it would start."""
    if not isinstance(spec, dict):
        return {
            prefix or "non_field_errors": ["The workflow must be a JSON object with its steps."]
        }
    found = first_unstorable(spec, prefix or "workflow")
    if found is not None:
        return {found[0]: [f"The value {found[1]}."]}
    try:
        builder = builder_from_spec(spec)
    except EnqueueError as error:
        return _under(error.errors or {"": [error.message]}, prefix)
    errors: dict[str, list[str]] = {}
    if len(builder.name) > MAX_NAME_LENGTH:
        errors["name"] = [f"The workflow's name is longer than {MAX_NAME_LENGTH} characters."]
    elif reason := text_problem(builder.name):
        errors["name"] = [f"The workflow's name {reason}."]
    specs = _job_specs(builder, errors)
    if not errors:
        try:
            plan_links(specs, [uuid.uuid4() for _ in specs])
        except EnqueueError as error:
            for field, messages in error.errors.items():
                head, _, rest = field.partition(".")
                key = f"steps.{field}" if head.isdigit() and rest else f"steps.0.{field}"
                errors.setdefault(key, []).extend(messages)
    return _under(errors, prefix)


def _job_specs(builder: WorkflowBuilder, errors: dict[str, list[str]]) -> list[JobSpec]:
    """The steps as the fire would enqueue them; each one's row problems into ``errors``."""
    names = {step["name"]: index for index, step in enumerate(builder.steps)}
    batch = SpecBatch(int(knob("MAX_PAYLOAD_BYTES")), db_now(), len(builder.steps))
    specs: list[JobSpec] = []
    for index, step in enumerate(builder.steps):
        try:
            depends_on = [_resolve(target, names) for target in step["depends_on"]]
        except EnqueueError as error:
            for field, messages in error.errors.items():
                errors.setdefault(f"steps.{index}.{field}", []).extend(messages)
            depends_on = []
        spec = JobSpec(
            operation=step["operation"],
            payload=step["payload"],
            depends_on=depends_on or None,
            on_failure=step["on_failure"] or builder.on_failure,
            **step["options"],
        )
        _, problems = prepare_row(spec, batch)
        for field, messages in problems.items():
            errors.setdefault(f"steps.{index}.{field}", []).extend(messages)
        specs.append(spec)
    return specs


def _resolve(target: Any, names: dict[str, int]) -> Any:
    """A step's name as its index (as ``WorkflowBuilder.enqueue`` resolves it); ids as they are."""
    if isinstance(target, After):
        return After(_resolve(target.job, names), target.on_failure)
    if isinstance(target, str) and target in names:
        return names[target]
    if isinstance(target, str):
        try:
            uuid.UUID(target)
        except ValueError:
            raise EnqueueError(
                f"No step is named {target!r}.", {"depends_on": [f"No step is named {target!r}."]}
            ) from None
    return target


def _under(errors: dict[str, list[str]], prefix: str) -> dict[str, list[str]]:
    if not prefix:
        return {(k or "non_field_errors"): list(v) for k, v in errors.items()}
    return {(f"{prefix}.{k}" if k else prefix): list(v) for k, v in errors.items()}
