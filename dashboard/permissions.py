"""Who may see and who may act.

Viewers hold ``controlplane.view_job`` and see everything; operators hold
``controlplane.change_job`` and may also cancel, retry, pause and requeue. Superusers
hold every permission, so they are operators. The checks live here and are
called by every view and by the WebSocket consumer; templates only hide the
buttons a user could not use anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

VIEW_PERM = "controlplane.view_job"
ACT_PERM = "controlplane.change_job"

OPERATOR = "operator"
VIEWER = "viewer"
ROLES = (OPERATOR, VIEWER)


def can_act(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(ACT_PERM))


def can_view(user: Any) -> bool:
    return bool(
        user
        and user.is_authenticated
        and user.is_active
        and (user.has_perm(VIEW_PERM) or user.has_perm(ACT_PERM))
    )


def role_of(user: Any) -> str | None:
    """``operator``, ``viewer`` or ``None`` for someone who may not see the dashboard."""
    if can_act(user):
        return OPERATOR
    if can_view(user):
        return VIEWER
    return None


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


def actor_name(user: Any) -> str:
    """How an operator is named in a job's timeline (``by``).

    A plain name stands for itself: the ``jobs`` command acts for a shell
    user who has no account (``--by``), and the audit log stores no user then.
    """
    if isinstance(user, str):
        return user
    return user.get_username() if user and user.is_authenticated else "anonymous"
