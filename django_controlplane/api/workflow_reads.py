"""Reads behind the workflow routes: the newest-first list, one workflow with its steps, and
what a job waits for (``GET /jobs/<id>/dependencies``).

Bounded for big graphs (a fan-in of 10,000 steps): a workflow's counts are
one aggregate over the ``job_workflow_idx`` index (``jobs.workflows.step_counts``);
at most ``MAX_STEPS_SHOWN`` steps are listed (``steps_truncated`` says when
there are more: ``GET /jobs?workflow=<id>`` pages through all of them), each with
at most ``MAX_DEPENDS_SHOWN`` dependency names, and the edges of the listed steps
are read in one statement of at most ``MAX_EDGES_READ`` rows.
``GET /jobs/<id>/dependencies`` lists at most ``MAX_DEPENDENCY_ROWS`` dependencies
and carries the results of the succeeded ones only while they add up to at most
``MAX_DEPENDENCY_RESULTS_BYTES`` (the bound a step's ``ctx.dependency_results()``
has); past it each row's ``result`` is left out and ``results_omitted`` says why.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q, Sum, TextField
from django.db.models.functions import Cast, Length

from jobs.conf import knob
from jobs.dependencies import DependencyResultsTooLarge, dependency_rows
from jobs.models import Dependency, Job, Workflow, WorkflowStatus
from jobs.selectors import InvalidFilter
from jobs.selectors.jobs import JobCursor
from jobs.workflows import step_counts

MAX_STEPS_SHOWN = 1000
MAX_DEPENDS_SHOWN = 100
MAX_EDGES_READ = 20_000
MAX_DEPENDENCY_ROWS = 10_000
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
ID_CHUNK = 2000  # ids per IN list (SQLite bounds a statement's parameters)
WORKFLOW_STATES: tuple[str, ...] = tuple(WorkflowStatus.values)


# --- the list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowFilters:
    status: tuple[str, ...] = ()
    name: str | None = None


def workflow_filters(params: Any) -> WorkflowFilters:
    """``status`` (one or more, repeated or comma-separated) and ``name`` (exact)."""
    raw = [v for value in params.getlist("status") for v in str(value).split(",") if v.strip()]
    statuses = tuple(dict.fromkeys(v.strip().lower() for v in raw))
    unknown = [s for s in statuses if s not in WORKFLOW_STATES]
    if unknown:
        raise InvalidFilter(
            {"status": [f"Unknown status {unknown[0]!r}; one of {', '.join(WORKFLOW_STATES)}."]}
        )
    name = params.get("name")
    return WorkflowFilters(status=statuses, name=name if name not in (None, "") else None)


@dataclass(frozen=True)
class WorkflowPage:
    results: list[Workflow]
    next_cursor: str | None


def workflow_list(filters: WorkflowFilters, cursor: str | None, limit: int) -> WorkflowPage:
    """One page of workflows, newest first (keyset on ``workflow_created_idx``)."""
    qs = Workflow.objects.all()
    if filters.status:
        qs = qs.filter(status__in=filters.status)
    if filters.name is not None:
        qs = qs.filter(name=filters.name)
    if cursor:
        at = JobCursor.decode(cursor)
        qs = qs.filter(created_at__lte=at.created_at).filter(
            Q(created_at__lt=at.created_at) | Q(id__lt=at.id)
        )
    rows = list(qs.order_by("-created_at", "-id")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    last = JobCursor(rows[-1].created_at, rows[-1].id).encode() if more and rows else None
    return WorkflowPage(rows, last)


# --- one workflow -------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkflowDetail:
    workflow: Workflow
    counts: dict[str, int]
    steps: list[dict[str, Any]]
    steps_truncated: bool


def workflow_detail(workflow_id: uuid.UUID) -> WorkflowDetail | None:
    """The workflow with its steps counted by status and its first ``MAX_STEPS_SHOWN`` steps
    (in the order they were added), or None."""
    run = Workflow.objects.filter(pk=workflow_id).first()
    if run is None:
        return None
    counts = step_counts(workflow_id)
    steps = list(
        Job.objects.filter(workflow_id=workflow_id)
        .order_by("created_at", "id")
        .values("id", "step", "operation", "status", "waiting_for")[:MAX_STEPS_SHOWN]
    )
    _add_depends_on(steps)
    return WorkflowDetail(run, counts, steps, sum(counts.values()) > len(steps))


def _add_depends_on(steps: list[dict[str, Any]]) -> None:
    """Each step's ``depends_on`` (the upstreams' step names, or job ids outside the workflow),
    at most ``MAX_DEPENDS_SHOWN`` each, and ``depends_on_count``, all of them."""
    ids = [s["id"] for s in steps]
    if not ids:
        return
    counts = dict(
        Dependency.objects.filter(job_id__in=ids)
        .order_by()
        .values_list("job_id")
        .annotate(n=Count("id"))
    )
    names: dict[uuid.UUID, list[str]] = defaultdict(list)
    edges = (
        Dependency.objects.filter(job_id__in=[i for i in ids if counts.get(i)])
        .order_by("id")
        .values_list("job_id", "upstream_id", "upstream__step")[:MAX_EDGES_READ]
    )
    for job_id, upstream, step in edges if counts else ():
        shown = names[job_id]
        if len(shown) < MAX_DEPENDS_SHOWN:
            shown.append(step or str(upstream))
    for step in steps:
        step["depends_on"] = names.get(step["id"], [])
        step["depends_on_count"] = counts.get(step["id"], 0)


# --- what a job waits for ----------------------------------------------------------------


@dataclass(frozen=True)
class DependencyPage:
    results: list[dict[str, Any]]
    truncated: bool
    results_omitted: str | None


def job_dependencies(job_id: uuid.UUID) -> DependencyPage:
    """What the job waits for (at most ``MAX_DEPENDENCY_ROWS``), each succeeded one with its
    ``result``, unless the results together pass ``MAX_DEPENDENCY_RESULTS_BYTES``."""
    rows = dependency_rows(job_id, limit=MAX_DEPENDENCY_ROWS + 1)
    truncated = len(rows) > MAX_DEPENDENCY_ROWS
    rows = rows[:MAX_DEPENDENCY_ROWS]
    succeeded = [r["id"] for r in rows if r["status"] == "succeeded"]
    omitted = None
    results: dict[uuid.UUID, Any] = {}
    if succeeded:
        try:
            results = _results(succeeded)
        except DependencyResultsTooLarge as error:
            omitted = str(error)
    for row in rows:
        if row["status"] == "succeeded" and omitted is None:
            row["result"] = results.get(row["id"])
    return DependencyPage(rows, truncated, omitted)


def _results(ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    """The results of these (succeeded) jobs; ``DependencyResultsTooLarge`` past the limit,
    measured first (the length of each result's JSON text) so no oversized read is made."""
    limit = int(knob("MAX_DEPENDENCY_RESULTS_BYTES"))
    found: dict[uuid.UUID, Any] = {}
    size = 0
    for start in range(0, len(ids), ID_CHUNK):
        part = ids[start : start + ID_CHUNK]
        measured = Job.objects.filter(pk__in=part).aggregate(
            total=Sum(Length(Cast("result", TextField())))
        )
        size += int(measured["total"] or 0)
        if size > limit:
            raise DependencyResultsTooLarge(
                f"The dependencies' results are more than MAX_DEPENDENCY_RESULTS_BYTES "
                f"({limit}) of JSON in all; read each job's result at GET /jobs/<id>."
            )
    for start in range(0, len(ids), ID_CHUNK):
        part = ids[start : start + ID_CHUNK]
        found.update(Job.objects.filter(pk__in=part).values_list("id", "result"))
    return found
