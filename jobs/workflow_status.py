"""A workflow's status, written in the transactions that end its steps.

``settle_workflows`` ends the workflows with no queued or running step left
(``succeeded`` when every final step succeeded, else ``failed``, with their
result); ``hold_workflows`` marks those a failed step holds for an operator;
``resume_workflows`` runs them again after an operator's retry. Called by
``jobs.dependencies`` inside the ending (or retrying) transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections

from jobs.dialect import dialect
from jobs.models import Workflow, WorkflowStatus
from jobs.tables import JOB_TABLE, WORKFLOW_TABLE

MAX_RESULT_STEPS = 100


def _locked_active(cursor: Any, ids: Sequence[uuid.UUID], using: str) -> list[uuid.UUID]:
    """Lock the workflows still running or held, in id order (PostgreSQL); their ids."""
    d = dialect(using)
    params = [d.uuid(i) for i in ids]
    lock = " ORDER BY id FOR UPDATE" if d.postgres else " ORDER BY id"
    cursor.execute(
        f"SELECT id FROM {WORKFLOW_TABLE} WHERE id IN {d.in_list(len(params))} "
        f"AND status IN ('running', 'held'){lock}",
        params,
    )
    return [d.read_id(r[0]) for r in cursor.fetchall()]


def settle_workflows(ids: Sequence[uuid.UUID], *, using: str = "default") -> None:
    """End the workflows among ``ids`` that have no queued or running step left.

    Inside the transaction that ended their steps. Each workflow's row is
    locked first, then its steps are read by a new statement: of two
    transactions ending a workflow's last two steps, the second sees the
    first's commit, so exactly one settles it.
    """
    d = dialect(using)
    with connections[using].cursor() as cursor:
        for workflow_id in _locked_active(cursor, ids, using):
            wf = d.uuid(workflow_id)
            cursor.execute(
                f"SELECT 1 FROM {JOB_TABLE} WHERE workflow_id = %s "
                "AND status IN ('queued', 'running') LIMIT 1",
                [wf],
            )
            if cursor.fetchone() is not None:
                continue
            cursor.execute(
                f"SELECT step, status, result FROM {JOB_TABLE} WHERE workflow_id = %s "
                f"AND NOT has_dependents ORDER BY step LIMIT {MAX_RESULT_STEPS + 1}",
                [wf],
            )
            finals = cursor.fetchall()
            cursor.execute(
                f"SELECT 1 FROM {JOB_TABLE} WHERE workflow_id = %s AND NOT has_dependents "
                "AND status <> 'succeeded' LIMIT 1",
                [wf],
            )
            failed = cursor.fetchone() is not None
            status = WorkflowStatus.FAILED if failed else WorkflowStatus.SUCCEEDED
            now_sql, now_params = d.now()
            cursor.execute(
                f"UPDATE {WORKFLOW_TABLE} SET status = %s, finished_at = {now_sql}, "
                f"result = {d.json_param} WHERE id = %s",
                [status.value, *now_params, d.json(_result(d, finals)), wf],
            )


def _result(d: Any, finals: Sequence[Sequence[Any]]) -> Any:
    """The final step's result, or ``{step: result}`` for several (None past MAX_RESULT_STEPS)."""
    if len(finals) == 1:
        return d.read_json(finals[0][2])
    if len(finals) > MAX_RESULT_STEPS:
        return None
    return {step: d.read_json(result) for step, _, result in finals}


def hold_workflows(ids: Iterable[uuid.UUID], *, using: str = "default") -> None:
    """Mark running workflows held: a failed step holds steps for an operator."""
    Workflow.objects.using(using).filter(pk__in=list(ids), status=WorkflowStatus.RUNNING).update(
        status=WorkflowStatus.HELD
    )


def resume_workflows(ids: Iterable[uuid.UUID], *, using: str = "default") -> None:
    """An operator retried a step: its workflow runs again (a settled one too)."""
    Workflow.objects.using(using).filter(pk__in=list(ids)).exclude(
        status=WorkflowStatus.CANCELLED
    ).update(status=WorkflowStatus.RUNNING, finished_at=None, result=None)
