"""A dashboard page's reads under a statement timeout, and the page shown when one runs out.

The limits themselves (``bounded_reads``: PostgreSQL ``SET LOCAL
statement_timeout`` inside a read transaction) and the capped counts are the
core's (``jobs.selectors.timeouts``, ``jobs.selectors.counts``); what is here
is the web side: the view decorator and the 503 page.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from jobs import replica
from jobs.conf import knob
from jobs.selectors.timeouts import bounded_reads, is_timeout


def timeout_response(request: HttpRequest) -> HttpResponse:
    """The 503 page shown when a read ran past the dashboard's statement timeout."""
    ms = int(knob("DASHBOARD_STATEMENT_TIMEOUT_MS"))
    return render(request, "dashboard/timeout.html", {"timeout_ms": ms}, status=503)


def bounded(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Render a read-only view under ``bounded_reads``; a timeout becomes a 503 page.

    Its reads go to the read replica when one is configured and fresh
    (``jobs.replica``), else to the primary.

    Views must return an already rendered response (``render``), so the lazy
    querysets a template touches run inside the timeout too.
    """

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        def read() -> HttpResponse:
            try:
                with bounded_reads(replica.read_alias()):
                    return view(request, *args, **kwargs)
            except DatabaseError as error:
                if not is_timeout(error):
                    raise
                return timeout_response(request)

        return replica.on_replica(read, request)  # the read replica, when there is one

    return wrapped
