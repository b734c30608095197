"""A workflow's steps laid out for its page: columns by depth, or counts per depth when large.

A step's depth is 0 when it waits for no other step of its workflow, else 1
+ the deepest of those it waits for (``jobs.selectors.workflows.step_depths``).
Up to ``WORKFLOW_MAX_BOXES`` steps (500) every step is a box in its depth's
column, naming the steps it waits for; past that, boxes would make the page
slow to serve and useless to read, so the page shows per-depth counts by
status instead (depths bucketed into at most ``MAX_DEPTH_ROWS`` rows), each
count linking to the job list filtered by workflow and status, and lists the
steps that ended badly (to retry them).

Depths never change once a workflow is enqueued (its edges are written in
the enqueue's transaction), so they are kept per process for the last few
large workflows read: the live relay re-counts a large workflow on every
change, and then reads only statuses.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from threading import Lock
from typing import Any

from dashboard.conf import setting
from jobs.models import Dependency
from jobs.selectors.workflows import (
    StepTuple,
    edge_keys,
    empty_counts,
    key_id,
    step_depths,
    step_keys,
    workflow_edges,
    workflow_steps,
)
from jobs.states import CANCELLED, FAILED, QUEUED

# Rows of the per-depth table at most; deeper graphs share rows (depths a–b).
MAX_DEPTH_ROWS = 100
# Names of the steps a box waits for; the rest are counted ("and 3 more").
WAITS_NAMED = 4
# Steps that ended badly listed under a large workflow's table (to open or retry).
ATTENTION_SHOWN = 50
# Large workflows whose depths this process keeps.
DEPTH_CACHE_SIZE = 16


@dataclass
class StepBox:
    """One step as its box shows it."""

    id: uuid.UUID
    name: str
    operation: str
    status: str
    waiting_for: int
    released: bool
    waits_for: list[str] = field(default_factory=list)
    waits_more: int = 0

    @property
    def waiting(self) -> bool:
        """Queued, its dependencies not all met yet."""
        return self.status == QUEUED and not self.released

    @property
    def can_retry(self) -> bool:
        return self.status in (FAILED, CANCELLED)


@dataclass
class DepthRow:
    """Steps of depths ``first``..``last`` by status."""

    first: int
    last: int
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class WorkflowGraph:
    total: int
    drawn: bool  # boxes (small) or per-depth counts (large)
    columns: list[list[StepBox]] = field(default_factory=list)
    depth_rows: list[DepthRow] = field(default_factory=list)
    depths: int = 0
    attention: list[StepBox] = field(default_factory=list)
    attention_more: int = 0
    counts: dict[str, int] = field(default_factory=empty_counts)  # steps by status


def max_boxes() -> int:
    return int(setting("WORKFLOW_MAX_BOXES"))


def _box(row: StepTuple) -> StepBox:
    pk, step, operation, status, waiting_for, released = row
    return StepBox(
        id=pk,
        name=step or str(pk)[:8],
        operation=operation,
        status=status,
        waiting_for=waiting_for,
        released=released,
    )


def _name_waits(boxes: list[StepBox], edges, names: dict[uuid.UUID, str]) -> None:
    """Fill each box's ``waits_for`` (first few names) and ``waits_more``."""
    ups: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for job, upstream in edges:
        ups[job].append(upstream)
    for box in boxes:
        upstreams = ups.get(box.id, [])
        box.waits_for = [names.get(u) or str(u)[:8] for u in upstreams[:WAITS_NAMED]]
        box.waits_more = max(0, len(upstreams) - WAITS_NAMED)


def workflow_graph(workflow_id: uuid.UUID) -> WorkflowGraph:
    """The page's graph: boxes by depth when the workflow has few steps, else counts.

    One read of every step's id and status decides (and counts by status);
    a drawn graph then reads its few steps' names and edges.
    """
    keys = step_keys(workflow_id)
    counts = empty_counts()
    for _, status in keys:
        counts[status] = counts.get(status, 0) + 1
    if len(keys) > max_boxes():
        graph = _large(workflow_id, keys)
    else:
        graph = _drawn(workflow_id)
    graph.counts = counts
    return graph


def _drawn(workflow_id: uuid.UUID) -> WorkflowGraph:
    steps = workflow_steps(workflow_id)
    edges = workflow_edges(workflow_id)
    depth = step_depths([s[0] for s in steps], edges)
    boxes = [_box(s) for s in steps]
    _name_waits(boxes, edges, {b.id: b.name for b in boxes})
    columns: list[list[StepBox]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for box in boxes:
        columns[depth[box.id]].append(box)
    return WorkflowGraph(total=len(boxes), drawn=True, columns=columns, depths=len(columns))


def step_boxes(workflow_id: uuid.UUID, ids: list[uuid.UUID]) -> list[StepBox]:
    """Fresh boxes for some steps of a drawn workflow (live updates), their waits named."""
    boxes = [_box(s) for s in workflow_steps(workflow_id, ids)]
    if not boxes:
        return []
    edges = list(
        Dependency.objects.filter(job_id__in=[b.id for b in boxes])
        .order_by("id")
        .values_list("job_id", "upstream_id", "upstream__step")
    )
    names = {upstream: step for _, upstream, step in edges if step}
    _name_waits(boxes, [(j, u) for j, u, _ in edges], names)
    return boxes


# --- large workflows --------------------------------------------------------------

_depth_cache: OrderedDict[uuid.UUID, tuple[int, dict[Any, int]]] = OrderedDict()
_depth_lock = Lock()


def _cached_depths(workflow_id: uuid.UUID, keys: list[Any]) -> dict[Any, int]:
    with _depth_lock:
        hit = _depth_cache.get(workflow_id)
        if hit is not None and hit[0] == len(keys):
            _depth_cache.move_to_end(workflow_id)
            return hit[1]
    depths = step_depths(keys, edge_keys(workflow_id))
    with _depth_lock:
        _depth_cache[workflow_id] = (len(keys), depths)
        while len(_depth_cache) > DEPTH_CACHE_SIZE:
            _depth_cache.popitem(last=False)
    return depths


def _large(workflow_id: uuid.UUID, steps: list[tuple[Any, str]]) -> WorkflowGraph:
    depth = _cached_depths(workflow_id, [key for key, _ in steps])
    deepest = max(depth.values(), default=0)
    width = -(-(deepest + 1) // MAX_DEPTH_ROWS)  # depths per row, rounded up
    rows = [
        DepthRow(first=i, last=min(i + width - 1, deepest), counts=empty_counts())
        for i in range(0, deepest + 1, width)
    ]
    bad: list[Any] = []
    for key, status in steps:
        counts = rows[depth.get(key, 0) // width].counts
        counts[status] = counts.get(status, 0) + 1
        if status in (FAILED, CANCELLED):
            bad.append(key)
    shown = [key_id(k) for k in bad[:ATTENTION_SHOWN]]
    return WorkflowGraph(
        total=len(steps),
        drawn=False,
        depth_rows=rows,
        depths=deepest + 1,
        attention=[_box(s) for s in workflow_steps(workflow_id, shown)] if shown else [],
        attention_more=max(0, len(bad) - ATTENTION_SHOWN),
    )
