"""The workflow list, a workflow's page (its graph of steps, live) and cancelling a workflow.

Retrying a step is the job page's own action (``dashboard:retry``), posted
from the step's box with ``next`` back to the workflow: the core's retry
resumes the workflow (``jobs.dependencies.after_retry``).
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard import render as fragments
from dashboard.conf import setting
from dashboard.views.common import action, base_context, no_store, page
from dashboard.workflow_graph import workflow_graph
from jobs import operator_actions
from jobs.models import Workflow
from jobs.permissions import role_of
from jobs.selectors import InvalidFilter
from jobs.selectors.workflows import WORKFLOW_STATES, workflow_page


def _statuses(request: HttpRequest) -> tuple[str, ...]:
    """The status filter: known values only (an unknown one is ignored, and said so)."""
    given = [s for v in request.GET.getlist("status") for s in v.split(",") if s.strip()]
    return tuple(dict.fromkeys(s.strip() for s in given if s.strip() in WORKFLOW_STATES))


@page
def workflow_list(request: HttpRequest) -> HttpResponse:
    status = _statuses(request)
    before = request.GET.get("before", "")
    cursor_error = ""
    limit = int(setting("PAGE_SIZE"))
    try:
        result = workflow_page(status=status, before=before, limit=limit)
    except InvalidFilter:
        cursor_error = "That page link is no longer valid; showing the newest workflows."
        result = workflow_page(status=status, limit=limit)
    status_query = "&".join(f"status={s}" for s in status)
    context = {
        **base_context(request, "workflows"),
        "rows": result.rows,
        "next_cursor": result.next_cursor,
        "status": status,
        "states": WORKFLOW_STATES,
        "status_query": status_query,
        "cursor_error": cursor_error,
        "paged": bool(before) and not cursor_error,
    }
    return render(request, "dashboard/workflows.html", context)


def _workflow_or_404(workflow_id: uuid.UUID) -> Workflow:
    workflow = Workflow.objects.filter(pk=workflow_id).first()
    if workflow is None:
        raise Http404("No such workflow.")
    return workflow


@page
def workflow_detail(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    loaded_at = timezone.now()
    workflow = _workflow_or_404(workflow_id)
    context = {
        **base_context(request, "workflows"),
        **fragments.workflow_context(workflow, role_of(request.user)),
        "loaded_at": loaded_at,
    }
    return render(request, fragments.WORKFLOW_TEMPLATE, context)


@page
def workflow_live(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """Polling fallback: the same fragments a WebSocket push carries (the whole graph)."""
    workflow = _workflow_or_404(workflow_id)
    html = fragments.workflow_live(
        workflow, role_of(request.user), graph=workflow_graph(workflow.pk)
    )
    return no_store(HttpResponse(html))


@action
def cancel(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    try:
        changed = operator_actions.cancel_workflow(
            workflow_id, user=request.user, reason=request.POST.get("reason", "")
        )
    except Workflow.DoesNotExist:
        raise Http404("No such workflow.") from None
    if changed:
        messages.success(
            request, f"Workflow cancelled: {changed:,} step{'' if changed == 1 else 's'} stopped."
        )
    else:
        messages.info(request, "The workflow had already ended; nothing changed.")
    return HttpResponseRedirect(reverse("dashboard:workflow", args=[workflow_id]))
