"""Where the control plane is mounted in the host project's URLconf.

Paths that are not Django URLs (the WebSocket routes, which Channels serves)
are handed out under the same prefix as the pages and the API, so a host that
mounts ``include("jobs.urls")`` at ``ops/`` gets ``/ops/ws/…`` everywhere.
"""

from __future__ import annotations

from django.urls import reverse


def mount_prefix() -> str:
    """The path the control plane is mounted at, with its slashes (``/`` or ``/ops/``)."""
    return reverse("dashboard:root")
