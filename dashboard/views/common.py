"""What every dashboard view shares: the decorators stack and the page context."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.conf import setting
from dashboard.db import bounded
from dashboard.inputs import printable, request_problems
from dashboard.permissions import operator_required, viewer_required
from dashboard.security import csp
from jobs.permissions import role_of

View = Callable[..., HttpResponse]


def page(view: View) -> View:
    """A read-only page: login, viewer role, statement timeout, security headers."""
    return csp(viewer_required(bounded(view)))


def action(view: View) -> View:
    """A state-changing POST: login, operator role, storable text (CSRF is the middleware's)."""
    return csp(operator_required(storable_text(view)))


def storable_text(view: View) -> View:
    """Refuse (400) a request whose form or query string holds text no database can store.

    One check for every action, before it runs: a NUL in a queue name, a
    reason or a bulk action's filter made PostgreSQL's driver fail (a 500)
    and was stored or matched as sent on SQLite. Both databases now get the
    same 400 page naming the field, and nothing is written.
    """

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        problems = request_problems(request.GET, request.POST)
        if problems:
            return refused(request, problems.values())
        return view(request, *args, **kwargs)

    return wrapped


def refused(
    request: HttpRequest,
    problems: Iterable[str],
    *,
    heading: str = "That request could not be carried out",
    back: str | None = None,
) -> HttpResponse:
    """The 400 page naming what was wrong with the operator's input; nothing was changed.

    ``back`` defaults to the page the request came from (same host only),
    or the overview.
    """
    if back is None:
        referer = request.headers.get("Referer", "")
        safe = url_has_allowed_host_and_scheme(referer, allowed_hosts={request.get_host()})
        back = printable(referer) if referer and safe else reverse("dashboard:overview")
    context = {
        **base_context(request, ""),
        "heading": heading,
        "problems": list(problems),
        "back_url": back,
    }
    return render(request, "dashboard/refused.html", context, status=400)


def base_context(request: HttpRequest, nav: str) -> dict[str, Any]:
    role = role_of(request.user)
    return {
        "nav": nav,
        "role": role,
        "can_act": role == "operator",
        "poll_base_ms": int(setting("POLL_BASE_MS")),
        "poll_max_ms": int(setting("POLL_MAX_MS")),
        "poll_slow_ms": int(setting("POLL_SLOW_MS")),
    }


def htmx_fragment(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true" or request.GET.get("live") == "1"


def no_store(response: HttpResponse) -> HttpResponse:
    response.headers["Cache-Control"] = "no-store"
    return response
