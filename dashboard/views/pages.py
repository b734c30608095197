"""Overview, workers and queues: each a full page, or with ``?live=1`` its live body."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard import render as fragments
from dashboard.permissions import role_of
from dashboard.views.common import base_context, no_store, page


def _summary(request: HttpRequest, name: str) -> HttpResponse:
    context = fragments.PAGE_CONTEXTS[name]()
    if request.GET.get("live") == "1":
        html = fragments.page_live(name, role_of(request.user), context)
        return no_store(HttpResponse(html))
    return render(
        request, fragments.PAGE_TEMPLATES[name], {**base_context(request, name), **context}
    )


@page
def overview(request: HttpRequest) -> HttpResponse:
    return _summary(request, "overview")


@page
def workers(request: HttpRequest) -> HttpResponse:
    return _summary(request, "workers")


@page
def queues(request: HttpRequest) -> HttpResponse:
    return _summary(request, "queues")
