"""Operator-started workflows, audited: what the REST API's ``POST /workflows`` (and any other
face that lets a person start a workflow from its JSON) calls.

Cancelling one is ``jobs.operator_actions.cancel_workflow``. Starting one is
here so the workflow, its steps and the audit row (``audit.START_WORKFLOW``,
target the workflow's id, count its steps) are one transaction: a refused
spec stores nothing and audits nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from jobs import audit
from jobs.models import Workflow
from jobs.workflow_specs import start_workflow as start_from_spec


def start_workflow(spec: Any, *, user: Any) -> Workflow:
    """Check ``spec`` (``jobs.workflow_specs``' JSON shape) and enqueue it, audited.

    Raises ``EnqueueError`` with errors by field (``steps.1.depends_on``) and stores nothing
    when the spec is invalid.
    """
    with transaction.atomic():
        run = start_from_spec(spec)
        steps = len(spec.get("steps", [])) if isinstance(spec, dict) else 0
        audit.record_action(user, audit.START_WORKFLOW, target=str(run.id), count=steps)
    return run
