"""The operations page: what can be enqueued, and for operators a form per operation.

The list is ``jobs.selectors.operations.operation_list``, the one ``GET
/operations`` shows. The form posts to ``enqueue``, which goes through the
API's enqueue path (``dashboard.operation_form``): on success it redirects
to the new job's page, otherwise it draws this page again (400) with the
errors beside the inputs and what the operator typed still in them.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from dashboard import operation_form
from dashboard.inputs import printable
from dashboard.permissions import operator_required
from dashboard.security import csp
from dashboard.views.common import base_context, page
from jobs.permissions import can_act
from jobs.selectors.operations import operation_get, operation_list
from jobs.storable import text_problem


def _render(
    request: HttpRequest,
    bound: operation_form.EnqueueForm | None = None,
    *,
    status: int = 200,
) -> HttpResponse:
    acting = can_act(request.user)
    rows = []
    for info in operation_list():
        form = None
        if acting:
            same = bound is not None and bound.operation.name == info.name
            form = bound if same else operation_form.EnqueueForm.blank(info)
        rows.append({"info": info, "form": form})
    context = {**base_context(request, "operations"), "rows": rows}
    return render(request, "dashboard/operations.html", context, status=status)


@page
def operations(request: HttpRequest) -> HttpResponse:
    return _render(request)


@csp
@operator_required
def enqueue(request: HttpRequest) -> HttpResponse:
    """POST only, operators only (CSRF is the middleware's): enqueue one job from the form."""
    name = request.POST.get("operation", "")
    info = None if text_problem(name) or len(name) > 200 else operation_get(name)
    if info is None:
        messages.error(
            request,
            f"Unknown operation {printable(name)[:200]!r}: it is not registered and no remote "
            "worker declares it. Nothing was enqueued.",
        )
        return _render(request, status=400)
    form, values = operation_form.bind(info, request.POST)
    job = operation_form.submit(form, values, user=request.user) if values is not None else None
    if job is None:
        messages.error(request, f"Nothing was enqueued: fix the fields marked in {info.name}.")
        return _render(request, form, status=400)
    messages.success(request, f"Enqueued {info.name} on queue {job.queue}.")
    return HttpResponseRedirect(reverse("dashboard:job", args=[job.pk]))
