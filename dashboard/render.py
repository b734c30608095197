"""Every HTML fragment the dashboard sends, from one place.

A page, its htmx polling answer and a WebSocket push all call these, and
these only render partials defined once in the page templates
(``{% partialdef %}``), so a row, a timeline entry or a progress bar has one
definition. Rendering needs no request: the relay renders once per role and
fans the result out to every open page. (Forms rendered without a request
carry no CSRF field; ``ui.js`` adds the token from the page on submit.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from dashboard import audit, selectors
from dashboard import detail as detail_reads
from dashboard.conf import setting
from dashboard.workflow_boxes import attention_html, depth_rows_html, step_boxes_html
from dashboard.workflow_graph import StepBox, WorkflowGraph, workflow_graph
from jobs.models import Job, JobEvent, Workflow
from jobs.permissions import OPERATOR
from jobs.selectors.flow_keys import held_back, waiting_reason
from jobs.selectors.workflows import step_dependencies
from jobs.states import CANCELLED, FAILED, QUEUED, RUNNING, TERMINAL
from jobs.waiting import DEPENDENCIES, dependency_wait, waiting_of
from jobs.workflows import ACTIVE_WORKFLOW, step_counts

JOB_TEMPLATE = "dashboard/job_detail.html"
LIST_TEMPLATE = "dashboard/jobs.html"
PAGE_TEMPLATES = {
    "overview": "dashboard/overview.html",
    "workers": "dashboard/workers.html",
    "queues": "dashboard/queues.html",
}


def role_context(role: str | None) -> dict[str, Any]:
    return {"role": role, "can_act": role == OPERATOR}


# --- summary pages ---------------------------------------------------------------


def overview_context() -> dict[str, Any]:
    queues = selectors.queue_rows()
    minutes = selectors.throughput()
    alive, stale = selectors.workers_alive()
    totals = {s: sum(int(q.counts[s]) for q in queues if s in q.counts) for s in selectors.STATES}
    capped = {s: any(q.counts[s].capped for q in queues if s in q.counts) for s in selectors.STATES}
    oldest = min((q.oldest_ready for q in queues if q.oldest_ready), default=None)
    return {
        "jobs_url": reverse("dashboard:jobs"),
        "queues": queues,
        "chart": throughput_chart(minutes),
        "failures": selectors.recent_failures(),
        "failure_hours": setting("FAILURE_WINDOW_HOURS"),
        "workers_alive": alive,
        "workers_stale": stale,
        "totals": totals,
        "totals_capped": capped,
        "oldest_ready": oldest,
    }


def throughput_chart(
    minutes: Sequence[selectors.Minute], width: int = 600, height: int = 120
) -> dict[str, Any]:
    """Bar geometry for the server-rendered SVG: one stacked bar per minute."""
    peak = max((m.total for m in minutes), default=0) or 1
    slot = width / max(len(minutes), 1)
    bars = []
    for i, m in enumerate(minutes):
        ok_h = height * m.succeeded / peak
        fail_h = height * m.failed / peak
        bars.append(
            {
                "x": round(i * slot + 1, 2),
                "w": round(max(slot - 2, 1), 2),
                "ok_y": round(height - ok_h, 2),
                "ok_h": round(ok_h, 2),
                "fail_y": round(height - ok_h - fail_h, 2),
                "fail_h": round(fail_h, 2),
                "minute": m,
            }
        )
    total_ok = sum(m.succeeded for m in minutes)
    total_failed = sum(m.failed for m in minutes)
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "peak": peak if any(m.total for m in minutes) else 0,
        "succeeded": total_ok,
        "failed": total_failed,
        "per_minute": round((total_ok + total_failed) / max(len(minutes), 1), 1),
        "start": minutes[0].at if minutes else None,
    }


def workers_context() -> dict[str, Any]:
    return {
        "workers": selectors.worker_rows(),
        "orphans": selectors.orphaned_jobs(),
        "orphan_count": selectors.orphan_count(),
    }


def queues_context() -> dict[str, Any]:
    return {
        "jobs_url": reverse("dashboard:jobs"),
        "queues": selectors.queue_rows(),
        "reclaims": selectors.reclaimed_recently(),
        "operator_actions": audit.recent_rows(),
        "reclaim_hours": setting("RECLAIM_WINDOW_HOURS"),
        "states": selectors.STATES,
        # Flow keys: per keyed queue the keys holding jobs back, and every key limit.
        "held_back": list(held_back().values()),
        "key_limits": selectors.key_limit_rows(),
    }


PAGE_CONTEXTS = {
    "overview": overview_context,
    "workers": workers_context,
    "queues": queues_context,
}


def page_live(page: str, role: str | None, context: dict[str, Any] | None = None) -> str:
    """The out-of-band body of a summary page (its ``live`` partial)."""
    ctx = {
        **(context if context is not None else PAGE_CONTEXTS[page]()),
        **role_context(role),
        "oob": True,
    }
    return render_to_string(f"{PAGE_TEMPLATES[page]}#body", ctx)


# --- job list ----------------------------------------------------------------------


def rows_oob(jobs: Iterable[Job], role: str | None) -> str:
    """Replacement rows for jobs already on a list page, swapped by id."""
    ctx = role_context(role)
    parts = [
        render_to_string(f"{LIST_TEMPLATE}#job-row", {**ctx, "job": job, "oob": True})
        for job in jobs
    ]
    if not parts:
        return ""
    # <tr> must be parsed inside a table context; a <template> keeps it intact.
    return format_html("<template>{}</template>", mark_safe("".join(parts)))


def new_jobs_banner(count: int, query: str, *, many: bool = False) -> str:
    return render_to_string(
        f"{LIST_TEMPLATE}#new-banner",
        {"new_count": count, "many": many, "query": query, "oob": True},
    )


# --- one job -------------------------------------------------------------------------


def job_context(detail: detail_reads.JobDetail, role: str | None) -> dict[str, Any]:
    job = detail.job
    can_act = role == OPERATOR
    waiting = waiting_of(job)
    dependencies = step_dependencies(job.pk)
    waits = dependency_wait(job, total=dependencies.total)
    reasons = list(waiting_reason(job)) if waits is None else [waits.sentence]
    return {
        **role_context(role),
        "detail": detail,
        "job": job,
        "progress": detail.progress,
        "waiting": waiting,
        "flow_keys": [k for k in (job.flow_keys or []) if isinstance(k, str)],
        "waiting_reasons": reasons,
        "dependencies": dependencies if dependencies.total else None,
        "workflow": (
            Workflow.objects.filter(pk=job.workflow_id).only("id", "name", "status").first()
            if job.workflow_id
            else None
        ),
        "can_cancel": can_act and job.status in (QUEUED, RUNNING),
        "can_retry": can_act and job.status in (FAILED, CANCELLED),
        # A job waiting for dependencies is released by them, never by an operator's "now".
        "can_run_now": can_act
        and waiting is not None
        and not waiting.due
        and waiting.kind != DEPENDENCIES,
        "can_discard": can_act and job.status in TERMINAL,
    }


def timeline_entries(events: Iterable[JobEvent]) -> list[tuple[int, SafeString]]:
    """Each event as ``(seq, html)``: consumers forward only the seqs their page lacks."""
    return [
        (event.seq, render_to_string(f"{JOB_TEMPLATE}#timeline-entry", {"event": event}))
        for event in events
    ]


def timeline_append(entries: Sequence[tuple[int, str]]) -> str:
    if not entries:
        return ""
    return format_html(
        '<ol hx-swap-oob="beforeend:#timeline">{}</ol>',
        mark_safe("".join(html for _, html in entries)),  # rendered, escaped partials
    )


def job_head(detail: detail_reads.JobDetail, role: str | None) -> str:
    """The parts of the job page that change with its state, out of band (not the timeline)."""
    return render_to_string(f"{JOB_TEMPLATE}#live", {**job_context(detail, role), "oob": True})


def job_live(detail: detail_reads.JobDetail, role: str | None, events: Sequence[JobEvent]) -> str:
    """A polling answer: the changing parts and the events the page does not have yet."""
    return job_head(detail, role) + timeline_append(timeline_entries(events))


# --- workflows -------------------------------------------------------------------------

WORKFLOW_TEMPLATE = "dashboard/workflow_detail.html"


def _workflow_head(
    workflow: Workflow, role: str | None, counts: dict[str, int] | None = None
) -> dict[str, Any]:
    counts = counts if counts is not None else step_counts(workflow.pk)
    can_act = role == OPERATOR
    return {
        **role_context(role),
        "workflow": workflow,
        "counts": counts,
        "total": sum(counts.values()),
        "back": reverse("dashboard:workflow", args=[workflow.pk]),
        "jobs_url": reverse("dashboard:jobs"),
        "can_cancel_workflow": can_act and workflow.status in ACTIVE_WORKFLOW,
    }


def workflow_context(
    workflow: Workflow, role: str | None, graph: WorkflowGraph | None = None
) -> dict[str, Any]:
    """What the workflow page shows: the head, counts and the graph."""
    graph = graph if graph is not None else workflow_graph(workflow.pk)
    ctx = _workflow_head(workflow, role, graph.counts)
    back, can_act = ctx["back"], ctx["can_act"]
    return {
        **ctx,
        "graph": graph,
        "columns": [
            {"count": len(column), "html": step_boxes_html(column, back=back, can_act=can_act)}
            for column in graph.columns
        ],
        "attention": attention_html(graph.attention, back=back, can_act=can_act),
        "depth_rows": depth_rows_html(
            graph.depth_rows, workflow_id=workflow.pk, jobs_url=ctx["jobs_url"]
        ),
    }


def workflow_live(
    workflow: Workflow,
    role: str | None,
    *,
    boxes: Sequence[StepBox] | None = None,
    graph: WorkflowGraph | None = None,
    counts: dict[str, int] | None = None,
) -> str:
    """The workflow page's changing parts, out of band: its head, then ``boxes`` (a drawn
    graph's steps that changed) or else ``graph`` whole (every box of a drawn one, a
    large one's counts); with neither, the head alone."""
    if counts is None and graph is not None:
        counts = graph.counts
    ctx = {**_workflow_head(workflow, role, counts), "oob": True}
    html = render_to_string(f"{WORKFLOW_TEMPLATE}#head", ctx)
    back, can_act = ctx["back"], ctx["can_act"]
    if boxes is None and graph is not None and graph.drawn:
        boxes = [b for column in graph.columns for b in column]
    if boxes is not None:
        return html + step_boxes_html(boxes, back=back, can_act=can_act, oob=True)
    if graph is not None:
        ctx.update(
            graph=graph,
            attention=attention_html(graph.attention, back=back, can_act=can_act),
            depth_rows=depth_rows_html(
                graph.depth_rows, workflow_id=workflow.pk, jobs_url=ctx["jobs_url"]
            ),
        )
        html += render_to_string(f"{WORKFLOW_TEMPLATE}#large", ctx)
    return html
