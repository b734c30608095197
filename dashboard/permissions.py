"""The dashboard's gates: view decorators and its 403 page over the roles of ``jobs.permissions``.

The roles themselves (who is a viewer, who an operator) are the core's, shared
with the admin and the WebSocket consumer; here they become redirects to the
login page and 403 pages. Templates only hide the buttons a user could not use
anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from jobs.permissions import can_act, can_view

View = Callable[..., HttpResponse]


def forbidden(request: HttpRequest, message: str) -> HttpResponse:
    """The dashboard's own 403 page (a project's ``403.html`` stays the project's)."""
    return TemplateResponse(request, "dashboard/403.html", {"exception": message}, status=403)


def viewer_required(view: View) -> View:
    """Anonymous users go to the login page; users without a dashboard role get 403."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can_view(request.user):
            return forbidden(request, "Your account may not see the dashboard.")
        return view(request, *args, **kwargs)

    return wrapped


def operator_required(view: View) -> View:
    """For state-changing views: POST only, operators only (viewers get 403)."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if request.method != "POST":
            return HttpResponse("Use POST.", status=405, headers={"Allow": "POST"})
        if not can_act(request.user):
            return forbidden(request, "Your account may look but not act: ask for operator rights.")
        return view(request, *args, **kwargs)

    return wrapped
