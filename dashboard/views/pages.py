"""Overview, workers and queues: each a full page, or with ``?live=1`` its live body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard import render as fragments
from dashboard.views.common import base_context, no_store, page
from dashboard.views.metrics import queue_charts_context
from jobs.permissions import role_of


def _summary(
    request: HttpRequest,
    name: str,
    extra: Callable[[HttpRequest], dict[str, Any]] | None = None,
) -> HttpResponse:
    """The page, or its live body; ``extra`` adds what only the full page shows."""
    context = fragments.PAGE_CONTEXTS[name]()
    if request.GET.get("live") == "1":
        html = fragments.page_live(name, role_of(request.user), context)
        return no_store(HttpResponse(html))
    more = extra(request) if extra else {}
    return render(
        request, fragments.PAGE_TEMPLATES[name], {**base_context(request, name), **context, **more}
    )


@page
def overview(request: HttpRequest) -> HttpResponse:
    return _summary(request, "overview")


@page
def workers(request: HttpRequest) -> HttpResponse:
    return _summary(request, "workers")


@page
def queues(request: HttpRequest) -> HttpResponse:
    # The per-queue charts sit outside the live body: the rollup changes once a reaper pass.
    return _summary(request, "queues", queue_charts_context)
