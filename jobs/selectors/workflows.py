"""Reads for workflow pages: the list, one workflow's steps and edges, a step's dependencies.

Every read stays on an index: the list on ``workflow_created_idx`` (newest
first, keyset-paginated on ``(created_at, id)``), a workflow's steps on the
partial ``job_workflow_idx`` ``(workflow, status)``, its edges through the
dependency table's unique ``(job, upstream)`` index, and what one job waits
for on that same index. The graph read returns plain tuples, not model
instances: a workflow of 10,000 steps is read in one statement for its steps
and one for its edges, and its page must stay well under 100 ms.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Q

from jobs.dialect import dialect
from jobs.models import Dependency, Job, Workflow, WorkflowStatus
from jobs.replica import read_alias, read_connection
from jobs.selectors.jobs import JobCursor
from jobs.states import Status
from jobs.tables import DEPENDENCY_TABLE, JOB_TABLE

WORKFLOW_STATES: tuple[str, ...] = tuple(WorkflowStatus.values)
# A step's dependencies listed on its page; the rest are counted.
DEPENDENCIES_SHOWN = 50


@dataclass
class WorkflowRow:
    """One line of the workflow list: the workflow and how many of its steps are in each status."""

    workflow: Workflow
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class WorkflowPage:
    rows: list[WorkflowRow]
    next_cursor: str | None  # older workflows, or None


def empty_counts() -> dict[str, int]:
    return dict.fromkeys(Status.values, 0)


def counts_by_workflow(ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[str, int]]:
    """Step counts by status for several workflows, in one grouped read of the partial index."""
    out: dict[uuid.UUID, dict[str, int]] = {i: empty_counts() for i in ids}
    if not ids:
        return out
    rows = (
        Job.objects.filter(workflow_id__in=ids)
        .order_by()
        .values_list("workflow_id", "status")
        .annotate(n=Count("pk"))
    )
    for workflow_id, status, n in rows:
        out.setdefault(workflow_id, empty_counts())[status] = n
    return out


def workflow_page(
    *, status: tuple[str, ...] = (), before: str = "", limit: int = 50
) -> WorkflowPage:
    """Workflows newest first (optionally of some statuses), a page after ``before``'s cursor.

    Raises ``InvalidFilter`` (``jobs.selectors``) for a cursor that cannot be read.
    """
    qs = Workflow.objects.all()
    if status:
        qs = qs.filter(status__in=status)
    if before:
        cursor = JobCursor.decode(before)
        qs = qs.filter(
            Q(created_at__lt=cursor.created_at) | Q(created_at=cursor.created_at, id__lt=cursor.id)
        )
    found = list(qs.order_by("-created_at", "-id")[: limit + 1])
    more = len(found) > limit
    found = found[:limit]
    counts = counts_by_workflow([w.id for w in found])
    rows = [WorkflowRow(workflow=w, counts=counts[w.id]) for w in found]
    next_cursor = JobCursor(found[-1].created_at, found[-1].id).encode() if more else None
    return WorkflowPage(rows=rows, next_cursor=next_cursor)


# --- one workflow's graph ----------------------------------------------------------

# (id, step name, operation, status, waiting_for, released): ``released`` is
# False while a queued step waits for dependencies (``run_after`` NULL).
StepTuple = tuple[uuid.UUID, str, str, str, int, bool]


def _rows(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    """A raw read on the connection the current scope reads from (replica or primary).

    Raw SQL, not the ORM: converting 10,000 ids and timestamps into Python
    objects is most of the ORM's time on a large workflow, and ids here are
    only compared with each other (``step_keys``/``edge_keys``).
    """
    with read_connection().cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def workflow_steps(workflow_id: uuid.UUID, ids: list[uuid.UUID] | None = None) -> list[StepTuple]:
    """A workflow's steps (or some of them) as tuples, in enqueue order (by id: UUIDv7)."""
    d = dialect(read_alias())
    sql = (
        "SELECT id, step, operation, status, waiting_for, run_after IS NOT NULL "
        f"FROM {JOB_TABLE} WHERE workflow_id = %s"
    )
    params: list[Any] = [d.uuid(workflow_id)]
    if ids is not None:
        if not ids:
            return []
        sql += f" AND id IN ({', '.join(['%s'] * len(ids))})"
        params += [d.uuid(i) for i in ids]
    rows = _rows(sql + " ORDER BY id", params)
    return [(d.read_id(r[0]), r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]


def step_keys(workflow_id: uuid.UUID) -> list[tuple[Any, str]]:
    """``(key, status)`` of every step: ``key`` is the id as the database returned it
    (``key_id`` makes it a UUID), in enqueue order."""
    d = dialect(read_alias())
    return _rows(
        f"SELECT {_key('id', d)}, status FROM {JOB_TABLE} WHERE workflow_id = %s ORDER BY id",
        [d.uuid(workflow_id)],
    )


def _key(column: str, d: Any) -> str:
    """A uuid column read as text on PostgreSQL: a string per row is several times
    cheaper for the driver than a ``UUID`` object (SQLite stores text already)."""
    return f"{column}::text" if d.postgres else column


def key_id(key: Any) -> uuid.UUID:
    return dialect(read_alias()).read_id(key)


def edge_keys(workflow_id: uuid.UUID) -> list[tuple[Any, Any]]:
    """``(job, upstream)`` keys of every dependency of the workflow's steps (upstreams
    outside the workflow included: a step may wait for any job)."""
    d = dialect(read_alias())
    return _rows(
        f"SELECT {_key('dep.job_id', d)}, {_key('dep.upstream_id', d)} FROM {DEPENDENCY_TABLE} dep "
        f"JOIN {JOB_TABLE} j ON j.id = dep.job_id WHERE j.workflow_id = %s",
        [d.uuid(workflow_id)],
    )


def workflow_edges(workflow_id: uuid.UUID) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """``edge_keys`` as UUIDs."""
    d = dialect(read_alias())
    return [(d.read_id(j), d.read_id(u)) for j, u in edge_keys(workflow_id)]


def dependents_in_workflow(workflow_id: uuid.UUID, upstreams: list[uuid.UUID]) -> list[uuid.UUID]:
    """The workflow's steps that wait for any of ``upstreams`` (their counts moved with them)."""
    if not upstreams:
        return []
    return list(
        Dependency.objects.filter(upstream_id__in=upstreams, job__workflow_id=workflow_id)
        .order_by()
        .values_list("job_id", flat=True)
        .distinct()
    )


def step_depths(step_ids: list[Any], edges: list[tuple[Any, Any]]) -> dict[Any, int]:
    """Each step's depth: 0 with no dependency in the workflow, else 1 + its deepest one's.

    Kahn's order over the edges between the workflow's own steps (an upstream
    outside the workflow does not deepen a step). Enqueue refuses cycles; a
    step left over by one anyway gets the depth after the last.
    """
    known = set(step_ids)
    upstreams: dict[Any, list[Any]] = defaultdict(list)
    downstreams: dict[Any, list[Any]] = defaultdict(list)
    for job, upstream in edges:
        if upstream in known and job in known:
            upstreams[job].append(upstream)
            downstreams[upstream].append(job)
    pending = {s: len(upstreams[s]) for s in step_ids if upstreams.get(s)}
    depth = dict.fromkeys(step_ids, 0)
    frontier = [s for s in step_ids if s not in pending]
    while frontier:
        nxt: list[Any] = []
        for s in frontier:
            d = depth[s] + 1
            for down in downstreams.get(s, ()):
                if d > depth[down]:
                    depth[down] = d
                pending[down] -= 1
                if not pending[down]:
                    nxt.append(down)
        frontier = nxt
    left = [s for s, n in pending.items() if n > 0]
    if left:
        last = max(depth.values(), default=0) + 1
        for s in left:
            depth[s] = last
    return depth


# --- one step's dependencies ----------------------------------------------------------


@dataclass
class StepDependencies:
    """What a job waits for, bounded: the first rows (unmet first) and the totals."""

    rows: list[dict[str, Any]]
    total: int
    unmet: int

    @property
    def more(self) -> int:
        return self.total - len(self.rows)


def step_dependencies(job_id: uuid.UUID, limit: int = DEPENDENCIES_SHOWN) -> StepDependencies:
    """``jobs.dependencies.dependency_rows``' fields for at most ``limit`` dependencies of a
    job, unmet ones first, with the totals (a fan-in step may wait for 10,000 jobs)."""
    edges = Dependency.objects.filter(job_id=job_id)
    totals = {"total": edges.count()}
    totals["unmet"] = edges.filter(met=False).count() if totals["total"] else 0
    # The first edges alone (one job's index entries, sorted), then their upstreams:
    # joining first would read every upstream of a 10,000-way fan-in to keep 50.
    first = list(edges.order_by("met", "id").values_list("id", flat=True)[:limit])
    found = {
        row["id"]: row
        for row in Dependency.objects.filter(pk__in=first).values(
            "id",
            "upstream_id",
            "upstream__step",
            "upstream__operation",
            "upstream__status",
            "on_failure",
            "met",
        )
    }
    rows = [
        {
            "id": row["upstream_id"],
            "step": row["upstream__step"],
            "operation": row["upstream__operation"],
            "status": row["upstream__status"],
            "on_failure": row["on_failure"],
            "met": row["met"],
        }
        for row in (found[i] for i in first if i in found)
    ]
    return StepDependencies(rows=rows, total=totals["total"] or 0, unmet=totals["unmet"] or 0)


def newest_change(workflow_id: uuid.UUID) -> datetime | None:
    """When any step of the workflow last changed (its polling answer's version)."""
    return (
        Job.objects.filter(workflow_id=workflow_id)
        .order_by("-last_event_at")
        .values_list("last_event_at", flat=True)
        .first()
    )
