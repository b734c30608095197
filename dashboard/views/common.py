"""What every dashboard view shares: the decorators stack and the page context."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from dashboard.conf import setting
from dashboard.db import bounded
from dashboard.permissions import operator_required, role_of, viewer_required
from dashboard.security import csp

View = Callable[..., HttpResponse]


def page(view: View) -> View:
    """A read-only page: login, viewer role, statement timeout, security headers."""
    return csp(viewer_required(bounded(view)))


def action(view: View) -> View:
    """A state-changing POST: login and operator role (CSRF is checked by the middleware)."""
    return csp(operator_required(view))


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
