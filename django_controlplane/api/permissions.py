"""Who may call what: each API view maps HTTP methods to one Django permission.

- reading (GET, HEAD, OPTIONS): ``controlplane.view_job``
- enqueue (POST /jobs): ``controlplane.add_job``
- cancel, retry, bulk actions, pause and resume: ``controlplane.change_job``
- the remote-worker protocol (register, heartbeat, disconnect, emit):
  ``controlplane.run_remote_jobs``

Superusers hold every permission. Anonymous callers get 401 (403 for a
session without the permission), and never any data.
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

VIEW = "controlplane.view_job"
ADD = "controlplane.add_job"
CHANGE = "controlplane.change_job"
REMOTE = "controlplane.run_remote_jobs"

READ_METHODS = ("GET", "HEAD", "OPTIONS")


class MethodPermission(BasePermission):
    """Grants a method when the user holds the permission the view names for it.

    Views set ``required_permissions = {"GET": VIEW, "POST": CHANGE, ...}``;
    HEAD and OPTIONS need what GET needs. A method the view does not name is
    let through to the view, which answers 405.
    """

    message = "You do not have permission to do this."

    def has_permission(self, request, view) -> bool:
        user = request.user
        if user is None or not user.is_authenticated:
            return False
        required = getattr(view, "required_permissions", {})
        method = "GET" if request.method in READ_METHODS else request.method
        permission = required.get(method)
        if permission is None:
            return True
        if user.has_perm(permission):
            return True
        self.message = f"You need the '{permission}' permission to do this."
        return False
