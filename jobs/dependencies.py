"""Jobs that wait for jobs: linked at enqueue, released by the end of their last dependency.

A job enqueued with ``depends_on`` is stored ``queued`` with ``run_after``
NULL: no claim, whichever path (``run_after <= now``), can take it. Its
``waiting_for`` counts the ``Dependency`` rows not yet met, and every job
something waits for has ``has_dependents`` set.

The end of a dependency is followed up in the transaction that writes it
(``release``, called by ``jobs.transitions`` and ``jobs.claims`` for jobs
flagged ``has_dependents`` or in a workflow): its edges are met (on success,
or on failure where the edge says ``run``), each waiting job's count drops
under its row lock, and the job whose count reaches 0 gets ``run_after`` =
now, in that same transaction: exactly once, however many workers end its
dependencies at the same moment, and no polling loop decides it. On failure
an edge's ``on_failure`` decides: ``cancel`` the waiting job (its timeline
says which dependency; the cancel goes on down the graph), ``run`` it anyway,
or ``hold`` it for an operator (its workflow shows ``held``; retrying the
failed job resumes from there, ``after_retry``).

Enqueue and end cannot miss each other: the enqueue locks each existing
upstream row (setting ``has_dependents``) and reads its status under that
lock, so it either sees the end (and counts the edge met) or holds the row
until its own commit, after which the ending transaction's next statement
sees the new edges.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from jobs import events
from jobs.conf import knob
from jobs.dialect import Dialect, Now, array_literal, dialect, quoted_element
from jobs.exceptions import ControlPlaneError, EnqueueError
from jobs.models import Dependency, Job, OnFailure
from jobs.states import CANCELLED, QUEUED, SUCCEEDED, TERMINAL
from jobs.status_writes import Ended, Event, move_unfollowed
from jobs.tables import DEPENDENCY_TABLE, JOB_TABLE
from jobs.wakeups import notify_queues
from jobs.workflow_status import hold_workflows, resume_workflows, settle_workflows

ON_FAILURE_VALUES = tuple(OnFailure.values)
# A job may wait for this many jobs at most (a fan-in of 10,000 steps into one is fine).
MAX_DEPENDENCIES = 100_000


@dataclass(frozen=True)
class After:
    """A dependency with its own failure policy: ``depends_on=[After(job, on_failure="run")]``.

    ``job``: a ``Job``, its id, or (inside one ``enqueue_many`` call) the index
    of another spec of the same call.
    """

    job: Any
    on_failure: str | None = None


@dataclass(frozen=True)
class Link:
    """One edge to store: ``job`` waits for ``upstream`` (ids)."""

    job: uuid.UUID
    upstream: uuid.UUID
    on_failure: str
    in_call: bool  # the upstream is a job of the same enqueue call


def plan_links(specs: Sequence[Any], ids: Sequence[uuid.UUID]) -> list[Link]:
    """The edges ``specs`` ask for (``depends_on``), checked; ``EnqueueError`` by field.

    ``ids`` are the specs' new job ids, in order. Refused: an index outside
    the call, a job depending on itself, a cycle among the call's jobs, an
    unknown ``on_failure``, ``run_after`` or a unique key on a job of a graph.
    """
    errors: dict[str, list[str]] = {}
    single = len(specs) == 1
    links: list[Link] = []
    edges: dict[int, list[int]] = defaultdict(list)
    in_graph: set[int] = set()

    def error(index: int, name: str, message: str) -> None:
        errors.setdefault(name if single else f"{index}.{name}", []).append(message)

    for index, spec in enumerate(specs):
        wanted = getattr(spec, "depends_on", None)
        default = getattr(spec, "on_failure", None) or OnFailure.CANCEL.value
        if default not in ON_FAILURE_VALUES:
            error(index, "on_failure", f"on_failure must be one of {', '.join(ON_FAILURE_VALUES)}.")
            continue
        if not wanted:
            continue
        if isinstance(wanted, str | bytes | dict) or not isinstance(wanted, Iterable):
            error(index, "depends_on", "depends_on must be a list of job ids.")
            continue
        wanted = list(wanted)
        if len(wanted) > MAX_DEPENDENCIES:
            error(index, "depends_on", f"A job may depend on {MAX_DEPENDENCIES} jobs at most.")
            continue
        in_graph.add(index)
        seen: set[uuid.UUID] = set()
        for item in wanted:
            target, policy = (
                (item.job, item.on_failure or default)
                if isinstance(item, After)
                else (item, default)
            )
            if policy not in ON_FAILURE_VALUES:
                error(
                    index,
                    "on_failure",
                    f"on_failure must be one of {', '.join(ON_FAILURE_VALUES)}.",
                )
                continue
            if isinstance(target, int) and not isinstance(target, bool):
                if not 0 <= target < len(specs):
                    error(index, "depends_on", f"No job {target} in this call.")
                    continue
                if target == index:
                    error(index, "depends_on", "A job cannot depend on itself.")
                    continue
                upstream, in_call = ids[target], True
                edges[index].append(target)
                in_graph.add(target)
            else:
                found = _job_id(target)
                if found is None:
                    error(index, "depends_on", f"No job with id {target}.")
                    continue
                upstream, in_call = found, False
            if upstream in seen:
                continue
            seen.add(upstream)
            links.append(Link(ids[index], upstream, policy, in_call))
    for index in sorted(in_graph):
        spec = specs[index]
        if getattr(spec, "run_after", None) is not None and getattr(spec, "depends_on", None):
            error(
                index,
                "run_after",
                "A job with depends_on starts when its dependencies are met: no run_after.",
            )
        if getattr(spec, "unique_key", None) is not None or getattr(spec, "idempotency_key", None):
            error(index, "unique_key", "A job with dependencies or dependents takes no unique key.")
    cycle = _cycle(edges)
    if cycle:
        error(
            cycle[0],
            "depends_on",
            f"These jobs depend on each other in a cycle: {' -> '.join(map(str, cycle))}.",
        )
    if errors:
        raise EnqueueError("The jobs were not enqueued: fix the fields named in 'errors'.", errors)
    return links


def _job_id(value: Any) -> uuid.UUID | None:
    value = getattr(value, "pk", value)
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


def _cycle(edges: dict[int, list[int]]) -> list[int]:
    """A cycle among the call's jobs (indexes, first repeated at the end), or [] (iterative DFS)."""
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for root in edges:
        if state.get(root):
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[int] = []
        while stack:
            node, next_child = stack.pop()
            if next_child == 0:
                state[node] = 1
                path.append(node)
            children = edges.get(node, [])
            if next_child < len(children):
                stack.append((node, next_child + 1))
                child = children[next_child]
                if state.get(child) == 1:
                    return [*path[path.index(child) :], child]
                if not state.get(child):
                    stack.append((child, 0))
            else:
                state[node] = 2
                path.pop()
    return []


@dataclass(frozen=True)
class Linked:
    """What ``link`` wrote on the new jobs: unmet counts, which others wait for, any cancel."""

    unmet: Counter[uuid.UUID]
    upstreams: set[uuid.UUID]
    cancelled: bool


def link(
    links: Sequence[Link],
    *,
    waiting: Sequence[uuid.UUID],
    workflow_id: uuid.UUID | None = None,
    steps: dict[uuid.UUID, str] | None = None,
    using: str = "default",
) -> Linked:
    """Store the edges of jobs just inserted (``run_after`` NULL), inside the enqueue's transaction.

    ``waiting``: the new jobs with dependencies. Existing upstreams are locked
    and read (``EnqueueError`` for one that does not exist); edges to ended
    ones are met at once, by the same rules as ``release``. Jobs with nothing
    left to wait for become claimable now; a job whose failed dependency says
    ``cancel`` is cancelled at once.
    """
    d = dialect(using)
    by_upstream: dict[uuid.UUID, list[Link]] = defaultdict(list)
    for edge in links:
        by_upstream[edge.upstream].append(edge)
    outside = sorted({e.upstream for e in links if not e.in_call})
    inside = sorted({e.upstream for e in links if e.in_call})
    status: dict[uuid.UUID, str] = {}
    with connections[using].cursor() as cursor:
        if outside:
            status = _lock_upstreams(cursor, d, outside)
            missing = [str(u) for u in outside if u not in status]
            if missing:
                raise EnqueueError(
                    "The jobs were not enqueued: a dependency does not exist.",
                    {"depends_on": [f"No job with id {m}." for m in missing]},
                )
        met: list[Link] = []
        cancel: dict[uuid.UUID, uuid.UUID] = {}
        for edge in links:
            state = status.get(edge.upstream)
            if state == SUCCEEDED or (state in TERMINAL and edge.on_failure == OnFailure.RUN):
                met.append(edge)
            elif state in TERMINAL and edge.on_failure == OnFailure.CANCEL:
                cancel.setdefault(edge.job, edge.upstream)
        met_set = set(met)
        _insert_edges(cursor, d, links, met_set)
        unmet = Counter(e.job for e in links if e not in met_set)
        marks = [
            (job, unmet.get(job, 0), (steps or {}).get(job, ""))
            for job in sorted({*waiting, *inside, *(steps or {})})
        ]
        _mark_new_jobs(cursor, d, marks, set(inside), workflow_id)
    if cancel:
        # And on down: what waits for them (in this call too), and their workflow.
        release(_cancel_waiting(cancel, using), using=using)
    return Linked(unmet=unmet, upstreams=set(inside), cancelled=bool(cancel))


def _lock_upstreams(cursor: Any, d: Dialect, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Flag existing jobs as having dependents, under their row locks (in id order).

    Returns their statuses, read under those locks."""
    if d.postgres:
        cursor.execute(
            f"SELECT id FROM {JOB_TABLE} WHERE id = ANY(%s::uuid[]) ORDER BY id FOR NO KEY UPDATE",
            [_id_array(ids)],
        )
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET has_dependents = TRUE WHERE id = ANY(%s::uuid[]) "
            "RETURNING id, status",
            [_id_array(ids)],
        )
    else:
        params = [d.uuid(i) for i in ids]
        cursor.execute(
            f"UPDATE {JOB_TABLE} SET has_dependents = 1 WHERE id IN {d.in_list(len(params))} "
            "RETURNING id, status",
            params,
        )
    return {d.read_id(r[0]): r[1] for r in cursor.fetchall()}


def _insert_edges(cursor: Any, d: Dialect, links: Sequence[Link], met: set[Link]) -> None:
    if not links:
        return
    if d.postgres:
        cursor.execute(
            f"INSERT INTO {DEPENDENCY_TABLE} (job_id, upstream_id, on_failure, met) "
            "SELECT * FROM unnest(%s::uuid[], %s::uuid[], %s::text[], %s::bool[])",
            [
                _id_array(e.job for e in links),
                _id_array(e.upstream for e in links),
                array_literal(e.on_failure for e in links),
                array_literal("t" if e in met else "f" for e in links),
            ],
        )
    else:
        rows = [(d.uuid(e.job), d.uuid(e.upstream), e.on_failure, e in met) for e in links]
        cursor.executemany(
            f"INSERT INTO {DEPENDENCY_TABLE} (job_id, upstream_id, on_failure, met) "
            "VALUES (%s, %s, %s, %s)",
            rows,
        )


def _mark_new_jobs(
    cursor: Any,
    d: Dialect,
    marks: Sequence[tuple[uuid.UUID, int, str]],
    upstreams: set[uuid.UUID],
    workflow_id: uuid.UUID | None,
) -> None:
    """Set the new jobs' counts, flags, workflow and step.

    Those with nothing left to wait for become claimable now."""
    if not marks:
        return
    now_sql, now_params = d.now()
    wf = d.uuid(workflow_id)
    if d.postgres:
        cursor.execute(
            f"UPDATE {JOB_TABLE} j SET waiting_for = v.n, has_dependents = v.up, "
            f"workflow_id = %s::uuid, step = v.step, "
            f"run_after = CASE WHEN v.n = 0 THEN COALESCE(j.run_after, {now_sql}) END "
            "FROM unnest(%s::uuid[], %s::int[], %s::bool[], %s::text[]) AS v(id, n, up, step) "
            "WHERE j.id = v.id",
            [
                wf,
                *now_params,
                _id_array(job for job, _, _ in marks),
                array_literal(str(n) for _, n, _ in marks),
                array_literal("t" if job in upstreams else "f" for job, _, _ in marks),
                array_literal(quoted_element(step) for _, _, step in marks),
            ],
        )
    else:
        rows = [(d.uuid(job), n, job in upstreams, step) for job, n, step in marks]
        cursor.executemany(
            f"UPDATE {JOB_TABLE} SET waiting_for = %s, has_dependents = %s, workflow_id = %s, "
            f"step = %s, run_after = CASE WHEN %s = 0 THEN COALESCE(run_after, {now_sql}) END "
            "WHERE id = %s",
            [(n, up, wf, step, n, *now_params, job) for job, n, up, step in rows],
        )


def release(
    ended: Sequence[Ended], *, using: str = "default", notify: bool = True
) -> list[tuple[uuid.UUID, str]]:
    """Follow up the end of ``ended`` jobs, inside the transaction that wrote it.

    Meets their edges, makes the jobs left with nothing to wait for
    claimable (and wakes their queues, unless ``notify`` is False: the caller
    claims them in this transaction, ``jobs.claims.complete_followed``),
    cancels those whose failed dependency says ``cancel`` (and, in turn, what
    waits for them), holds the workflows whose edges say ``hold``, and
    settles the workflows that have nothing left to run. Returns ``(id,
    queue)`` of the jobs made claimable.
    """
    d = dialect(using)
    workflows = {e.workflow_id for e in ended if e.workflow_id}
    frontier = list(ended)
    started: list[tuple[uuid.UUID, str]] = []
    # Workflows with a step this transaction counted down and left queued (its row is
    # locked here): none can settle now, and that step's own end settles it later.
    busy: set[uuid.UUID] = set()
    only_successes = True
    while frontier:
        succeeded = [e.id for e in frontier if e.status == SUCCEEDED]
        failed = [e.id for e in frontier if e.status != SUCCEEDED]
        only_successes = only_successes and not failed
        with connections[using].cursor() as cursor:
            counted = _count_down(cursor, d, _meet(cursor, d, succeeded, failed))
            released = [(job, queue) for job, queue, runs, _ in counted if runs]
            busy |= {workflow for _, _, _, workflow in counted if workflow is not None}
            cancel: dict[uuid.UUID, uuid.UUID] = {}
            held: set[uuid.UUID] = set()
            if failed:
                for job, upstream, policy, workflow in _unmet_after_failure(cursor, d, failed):
                    if policy == OnFailure.CANCEL:
                        cancel.setdefault(job, upstream)
                    elif policy == OnFailure.HOLD and workflow is not None:
                        held.add(workflow)
        if released:
            started += released
            if notify:
                notify_queues(sorted({queue for _, queue in released}), using=using)
        if held:
            hold_workflows(held, using=using)
        frontier = _cancel_waiting(cancel, using) if cancel else []
        workflows |= {e.workflow_id for e in frontier if e.workflow_id}
    if only_successes:
        workflows -= busy
    if workflows:
        settle_workflows(sorted(workflows), using=using)
    return started


def _id_array(ids: Iterable[uuid.UUID]) -> str:
    """Job ids as one ``uuid[]`` text parameter (PostgreSQL)."""
    return array_literal(str(i) for i in ids)


def _meet(
    cursor: Any, d: Dialect, succeeded: Sequence[uuid.UUID], failed: Sequence[uuid.UUID]
) -> Counter[uuid.UUID]:
    """Mark met the unmet edges from ``succeeded`` jobs, and the ``run`` edges from ``failed``
    ones; how many each waiting job got.

    PostgreSQL: one statement, which also locks the waiting jobs' rows in id
    order, so transactions meeting edges of the same jobs (a diamond's two
    sides ending at once) queue up, never deadlock.
    """
    if not succeeded and not failed:
        return Counter()
    if d.postgres:
        cursor.execute(
            f"WITH met AS (UPDATE {DEPENDENCY_TABLE} SET met = TRUE "
            "WHERE NOT met AND (upstream_id = ANY(%s::uuid[]) "
            "OR (upstream_id = ANY(%s::uuid[]) AND on_failure = 'run')) RETURNING job_id) "
            "SELECT j.id, (SELECT count(*) FROM met WHERE met.job_id = j.id) "
            f"FROM {JOB_TABLE} j WHERE j.id IN (SELECT job_id FROM met) "
            "ORDER BY j.id FOR NO KEY UPDATE OF j",
            [_id_array(succeeded), _id_array(failed)],
        )
        return Counter({r[0]: int(r[1]) for r in cursor.fetchall()})
    met: list[Any] = []
    for upstreams, policy in ((succeeded, ""), (failed, " AND on_failure = 'run'")):
        if upstreams:
            params = [d.uuid(u) for u in upstreams]
            cursor.execute(
                f"UPDATE {DEPENDENCY_TABLE} SET met = 1 WHERE upstream_id IN "
                f"{d.in_list(len(params))} AND NOT met{policy} RETURNING job_id",
                params,
            )
            met += [d.read_id(r[0]) for r in cursor.fetchall()]
    return Counter(met)


def _count_down(
    cursor: Any, d: Dialect, met: Counter[Any]
) -> list[tuple[uuid.UUID, str, bool, uuid.UUID | None]]:
    """Lower each job's count by its edges just met (rows locked by ``_meet``); the queued ones
    left at 0 become claimable. Returns, for each job still queued, ``(id, queue, released,
    workflow id)``.
    """
    if not met:
        return []
    ids = sorted(met)
    now_sql, now_params = d.now()
    columns = "id, queue, status, waiting_for, run_after IS NOT NULL, workflow_id"
    if d.postgres:
        cursor.execute(
            f"UPDATE {JOB_TABLE} j SET waiting_for = j.waiting_for - v.n, "
            f"run_after = CASE WHEN j.status = 'queued' AND j.waiting_for - v.n <= 0 "
            f"THEN {now_sql} ELSE j.run_after END "
            "FROM unnest(%s::uuid[], %s::int[]) AS v(id, n) WHERE j.id = v.id "
            f"RETURNING {', '.join('j.' + c for c in columns.split(', '))}",
            [*now_params, _id_array(ids), array_literal(str(met[i]) for i in ids)],
        )
        rows = cursor.fetchall()
    else:
        rows = []
        for i in ids:
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET waiting_for = waiting_for - %s, "
                f"run_after = CASE WHEN status = 'queued' AND waiting_for - %s <= 0 "
                f"THEN {now_sql} ELSE run_after END WHERE id = %s RETURNING {columns}",
                [met[i], met[i], *now_params, d.uuid(i)],
            )
            rows += cursor.fetchall()
    return [
        (d.read_id(r[0]), r[1], r[3] <= 0 and bool(r[4]), d.read_uuid(r[5]))
        for r in rows
        if r[2] == QUEUED
    ]


def _unmet_after_failure(
    cursor: Any, d: Dialect, failed: Sequence[uuid.UUID]
) -> list[tuple[uuid.UUID, uuid.UUID, str, uuid.UUID | None]]:
    """The edges a failure leaves unmet whose jobs still wait: what to cancel or hold."""
    params: list[Any] = [d.uuid(u) for u in failed]
    where = (
        "dep.upstream_id = ANY(%s::uuid[])"
        if d.postgres
        else f"dep.upstream_id IN {d.in_list(len(params))}"
    )
    cursor.execute(
        "SELECT dep.job_id, dep.upstream_id, dep.on_failure, j.workflow_id "
        f"FROM {DEPENDENCY_TABLE} dep "
        f"JOIN {JOB_TABLE} j ON j.id = dep.job_id "
        f"WHERE {where} AND NOT dep.met AND j.status = 'queued' ORDER BY dep.job_id",
        [_id_array(failed)] if d.postgres else params,
    )
    return [(d.read_id(r[0]), d.read_id(r[1]), r[2], d.read_uuid(r[3])) for r in cursor.fetchall()]


def _cancel_waiting(cancel: dict[uuid.UUID, uuid.UUID], using: str) -> list[Ended]:
    """Cancel waiting jobs whose dependency failed (by upstream, for the timeline's reason)."""
    by_upstream: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
    for job, upstream in cancel.items():
        by_upstream[upstream].append(job)
    ended: list[Ended] = []
    for upstream, jobs in sorted(by_upstream.items()):
        moved = move_unfollowed(
            target=CANCELLED,
            sources=(QUEUED,),
            job_ids=sorted(jobs),
            event=Event(
                events.JOB_CANCELLED,
                level="warning",
                message=f"dependency {upstream} did not succeed",
                fields={"reason": "dependency_failed", "dependency": str(upstream)},
            ),
            assign={"finished_at": Now(), "leased_until": None},
            using=using,
        )
        ended += [Ended(m.id, CANCELLED, w) for m, w in _workflows_of(moved, using)]
    return ended


def _workflows_of(moved: Sequence[Any], using: str) -> list[tuple[Any, uuid.UUID | None]]:
    if not moved:
        return []
    found = dict(
        Job.objects.using(using)
        .filter(pk__in=[m.id for m in moved])
        .values_list("pk", "workflow_id")
    )
    return [(m, found.get(m.id)) for m in moved]


def after_retry(job_ids: Sequence[uuid.UUID], *, using: str = "default") -> None:
    """Inside an operator's retry: the graph resumes from the retried jobs.

    A retried job whose dependencies are not all met goes back to waiting
    (``run_after`` NULL). Jobs that were cancelled because a retried job had
    failed are retried with it (and so on down), waiting for it again; their
    workflows run again.
    """
    d = dialect(using)
    frontier = sorted(set(job_ids))
    workflows: set[uuid.UUID] = set()
    while frontier:
        params = [d.uuid(i) for i in frontier]
        with connections[using].cursor() as cursor:
            cursor.execute(
                f"UPDATE {JOB_TABLE} SET run_after = NULL WHERE id IN {d.in_list(len(params))} "
                "AND status = 'queued' AND waiting_for > 0",
                params,
            )
            cursor.execute(
                f"SELECT workflow_id FROM {JOB_TABLE} WHERE id IN {d.in_list(len(params))} "
                "AND workflow_id IS NOT NULL",
                params,
            )
            workflows |= {d.read_id(r[0]) for r in cursor.fetchall()}
            cursor.execute(
                f"SELECT DISTINCT dep.job_id FROM {DEPENDENCY_TABLE} dep JOIN {JOB_TABLE} j "
                f"ON j.id = dep.job_id WHERE dep.upstream_id IN {d.in_list(len(params))} "
                "AND NOT dep.met AND dep.on_failure = 'cancel' AND j.status = 'cancelled'",
                params,
            )
            downstream = sorted(d.read_id(r[0]) for r in cursor.fetchall())
        moved = (
            move_unfollowed(
                target=QUEUED,
                sources=(CANCELLED,),
                job_ids=downstream,
                event=Event(
                    events.JOB_RETRIED,
                    message="a dependency was retried",
                    fields={"reason": "dependency_retried"},
                ),
                assign={
                    "finished_at": None,
                    "run_after": None,
                    "error_code": "",
                    "error_message": "",
                },
                using=using,
            )
            if downstream
            else []
        )
        frontier = [m.id for m in moved]
    if workflows:
        resume_workflows(sorted(workflows), using=using)


def dependency_rows(
    job_id: uuid.UUID, *, limit: int | None = None, using: str = "default"
) -> list[dict[str, Any]]:
    """What a job waits for (the first ``limit``, in the order given): each dependency's id,
    step, operation, status, policy and whether it is met."""
    rows = (
        Dependency.objects.using(using)
        .filter(job_id=job_id)
        .order_by("id")
        .values(
            "upstream_id",
            "upstream__step",
            "upstream__operation",
            "upstream__status",
            "on_failure",
            "met",
        )
    )
    return [
        {
            "id": row["upstream_id"],
            "step": row["upstream__step"],
            "operation": row["upstream__operation"],
            "status": row["upstream__status"],
            "on_failure": row["on_failure"],
            "met": row["met"],
        }
        for row in (rows if limit is None else rows[:limit])
    ]


class DependencyResultsTooLarge(ControlPlaneError):
    """A job's dependencies' results exceed ``MAX_DEPENDENCY_RESULTS_BYTES`` in all."""


def dependency_results(job_id: uuid.UUID, *, using: str = "default") -> dict[str, Any]:
    """The results of the succeeded jobs ``job_id`` waited for, by step name (else job id).

    Bounded: more than ``MAX_DEPENDENCY_RESULTS_BYTES`` of JSON in all raises
    ``DependencyResultsTooLarge`` (each result is already at most ``MAX_RESULT_BYTES``).
    """
    d = dialect(using)
    size = "octet_length(u.result::text)" if d.postgres else "length(u.result)"
    source = (
        f"FROM {DEPENDENCY_TABLE} dep JOIN {JOB_TABLE} u ON u.id = dep.upstream_id "
        "WHERE dep.job_id = %s AND u.status = 'succeeded'"
    )
    limit = int(knob("MAX_DEPENDENCY_RESULTS_BYTES"))
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(SUM({size}), 0) {source}", [d.uuid(job_id)])
        total = int(cursor.fetchone()[0] or 0)
        if total > limit:
            raise DependencyResultsTooLarge(
                f"The dependencies' results are {total} bytes of JSON, more than "
                f"MAX_DEPENDENCY_RESULTS_BYTES ({limit}): pass references, not data."
            )
        cursor.execute(f"SELECT u.step, u.id, u.result {source} ORDER BY dep.id", [d.uuid(job_id)])
        return {
            (step or str(d.read_id(upstream))): d.read_json(result)
            for step, upstream, result in cursor.fetchall()
        }
