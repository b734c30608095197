"""Workflows: jobs enqueued together, with dependencies between them, followed as one.

Build one in Python and enqueue it in one transaction::

    flow = workflow("nightly report")
    a = flow.step("fetch", {"source": "eu"})
    b = flow.step("fetch", {"source": "us"}, name="fetch-us")
    flow.step("merge", depends_on=[a, b])
    run = flow.enqueue()          # a ``Workflow``; run.id names it everywhere

Steps run when what they depend on has succeeded (``jobs.dependencies``);
a step's failure cancels, runs anyway or holds what waits for it (the
workflow's ``on_failure``, or one edge's ``After(step, on_failure=...)``).
A step reads its dependencies' results with ``ctx.dependency_results()``.

The workflow's own status follows its steps, written in the transaction
that ends its last active step (``jobs.workflow_status``): ``succeeded`` when
every final step (one nothing waits for) succeeded, else ``failed``;
``held`` while a failed step holds steps for an operator; ``cancelled``
when an operator cancelled it. Its result is its final step's result, or
``{step: result}`` when it has several (up to ``MAX_RESULT_STEPS``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef

from jobs.clock import db_now
from jobs.dependencies import After
from jobs.exceptions import EnqueueError
from jobs.models import Job, OnFailure, Workflow, WorkflowStatus
from jobs.storable import text_problem
from jobs.transitions import cancel_jobs

MAX_STEPS = 100_000
MAX_NAME_LENGTH = 200
ACTIVE_WORKFLOW = (WorkflowStatus.RUNNING.value, WorkflowStatus.HELD.value)


@dataclass(frozen=True)
class Step:
    """A step of a workflow being built: pass it in another step's ``depends_on``."""

    index: int
    name: str


@dataclass
class WorkflowBuilder:
    """Steps and their dependencies, enqueued at once by ``enqueue``."""

    name: str = ""
    on_failure: str = OnFailure.CANCEL.value
    steps: list[dict[str, Any]] = field(default_factory=list)
    _names: dict[str, int] = field(default_factory=dict)

    def step(
        self,
        operation: str,
        payload: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        depends_on: Iterable[Any] = (),
        on_failure: str | None = None,
        **options: Any,
    ) -> Step:
        """Add a step (``options``: the fields of ``JobSpec``). ``depends_on`` takes steps
        (``Step`` or a step's name, even one added later), job ids and ``After``."""
        if name is None:
            name = (
                operation if operation not in self._names else f"{operation}-{len(self.steps) + 1}"
            )
        if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
            raise EnqueueError(
                "The step was not added: its name must be 1 to 200 characters.",
                {"name": ["A step's name must be 1 to 200 characters."]},
            )
        if reason := text_problem(name):
            raise EnqueueError(
                f"The step was not added: its name {reason}.",
                {"name": [f"A step's name {reason}."]},
            )
        if name in self._names:
            raise EnqueueError(
                f"The step was not added: the workflow has a step named {name!r} already.",
                {"name": [f"Another step is named {name!r}."]},
            )
        self._names[name] = len(self.steps)
        self.steps.append(
            {
                "operation": operation,
                "payload": payload if payload is not None else {},
                "name": name,
                "depends_on": list(depends_on),
                "on_failure": on_failure,
                "options": options,
            }
        )
        return Step(len(self.steps) - 1, name)

    def enqueue(self, *, schedule: uuid.UUID | None = None, using: str = "default") -> Workflow:
        """Store the workflow and all its steps in one transaction; nothing if any is invalid."""
        from jobs.enqueue import Graph, JobSpec, enqueue_many

        problem = self._problem()
        if problem:
            raise EnqueueError(f"The workflow was not enqueued: {problem}", {"steps": [problem]})
        specs = [
            JobSpec(
                operation=s["operation"],
                payload=s["payload"],
                depends_on=[self._resolve(d) for d in s["depends_on"]] or None,
                on_failure=s["on_failure"] or self.on_failure,
                **s["options"],
            )
            for s in self.steps
        ]
        run = Workflow(name=self.name, on_failure=self.on_failure, schedule_id=schedule)
        enqueue_many(
            specs, using=using, graph=Graph(workflow=run, steps=[s["name"] for s in self.steps])
        )
        return run

    @property
    def step_names(self) -> set[str]:
        return set(self._names)

    def _problem(self) -> str | None:
        if not self.steps:
            return "it has no steps."
        if len(self.steps) > MAX_STEPS:
            return f"it has {len(self.steps)} steps, more than {MAX_STEPS}."
        if self.on_failure not in OnFailure.values:
            return f"on_failure must be one of {', '.join(OnFailure.values)}."
        if not isinstance(self.name, str) or len(self.name) > MAX_NAME_LENGTH:
            return "its name must be at most 200 characters."
        reason = text_problem(self.name)
        return f"its name {reason}." if reason else None

    def _resolve(self, target: Any) -> Any:
        """A step (handle or name) as the index of its spec; job ids as they are."""
        if isinstance(target, After):
            return After(self._resolve(target.job), target.on_failure)
        if isinstance(target, Step):
            return target.index
        if isinstance(target, str) and target in self._names:
            return self._names[target]
        if isinstance(target, str):
            try:
                uuid.UUID(target)
            except ValueError:
                raise EnqueueError(
                    f"The workflow was not enqueued: no step is named {target!r}.",
                    {"depends_on": [f"No step is named {target!r}."]},
                ) from None
        return target


def workflow(name: str = "", *, on_failure: str = OnFailure.CANCEL.value) -> WorkflowBuilder:
    """A new workflow to add steps to; ``on_failure`` is every edge's default policy."""
    return WorkflowBuilder(name=name, on_failure=on_failure)


def cancel_workflow(
    workflow_id: uuid.UUID,
    *,
    by: str | None = None,
    reason: str | None = None,
    using: str = "default",
) -> int:
    """Cancel every queued and running step (running ones stop cooperatively), with a reason.

    Idempotent; a finished workflow stays as it is. Returns how many steps changed.
    """
    with transaction.atomic(using=using):
        changed = (
            Workflow.objects.using(using)
            .filter(pk=workflow_id, status__in=ACTIVE_WORKFLOW)
            .update(status=WorkflowStatus.CANCELLED, finished_at=db_now(using))
        )
        if not changed:
            return 0
        active = list(
            Job.objects.using(using)
            .filter(workflow_id=workflow_id, status__in=("queued", "running"))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        return len(cancel_jobs(active, by=by, reason=reason or "workflow cancelled", using=using))


def step_counts(workflow_id: uuid.UUID, *, using: str = "default") -> dict[str, int]:
    """How many of the workflow's steps are in each status (every status named)."""
    from django.db.models import Count

    counts = dict.fromkeys(("queued", "running", "succeeded", "failed", "cancelled"), 0)
    rows = (
        Job.objects.using(using)
        .filter(workflow_id=workflow_id)
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
    )
    counts.update(dict(rows))
    return counts


def prune_finished_workflows(cutoff: datetime, limit: int, *, using: str = "default") -> int:
    """Delete up to ``limit`` workflows finished before ``cutoff`` whose steps retention took.

    A workflow keeps its row while any step is kept, so its page and status stay
    whole; once the reaper's retention has deleted the last one, the row goes too.
    """
    ids = list(
        Workflow.objects.using(using)
        .filter(finished_at__lt=cutoff)
        .exclude(Exists(Job.objects.filter(workflow_id=OuterRef("pk"))))
        .order_by("finished_at")
        .values_list("pk", flat=True)[:limit]
    )
    if not ids:
        return 0
    return Workflow.objects.using(using).filter(pk__in=ids).delete()[0]
