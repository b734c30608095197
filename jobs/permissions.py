"""Who may see and who may act: the two operator roles every face checks.

Viewers hold ``controlplane.view_job`` and see everything; operators hold
``controlplane.change_job`` and may also cancel, retry, pause and requeue.
Superusers hold every permission, so they are operators. The dashboard, its
WebSocket consumer and the Django admin all ask these functions, so a role
means the same on each; only how a refusal is shown differs per face.
"""

from __future__ import annotations

from typing import Any

VIEW_PERM = "controlplane.view_job"
ACT_PERM = "controlplane.change_job"

OPERATOR = "operator"
VIEWER = "viewer"
ROLES = (OPERATOR, VIEWER)


def can_act(user: Any) -> bool:
    """Whether ``user`` may change jobs and queues (an operator)."""
    return bool(user and user.is_authenticated and user.is_active and user.has_perm(ACT_PERM))


def can_view(user: Any) -> bool:
    """Whether ``user`` may see jobs, queues and workers (a viewer or an operator)."""
    return bool(
        user
        and user.is_authenticated
        and user.is_active
        and (user.has_perm(VIEW_PERM) or user.has_perm(ACT_PERM))
    )


def role_of(user: Any) -> str | None:
    """``operator``, ``viewer`` or ``None`` for someone who may see nothing."""
    if can_act(user):
        return OPERATOR
    if can_view(user):
        return VIEWER
    return None
