"""Where the control plane is mounted in the host project's URLconf.

Paths that are not Django URLs (the WebSocket routes, which Channels serves)
are handed out under the same prefix as the pages and the API, so a host that
mounts ``include("django_controlplane.urls")`` at ``ops/`` gets ``/ops/ws/…`` everywhere.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, reverse


class NotMounted(ImproperlyConfigured):
    """The project's URLconf does not include the control plane's URLs."""


def mount_prefix() -> str:
    """The path the control plane is mounted at, with its slashes (``/`` or ``/ops/``)."""
    try:
        return reverse("dashboard:root")
    except NoReverseMatch:
        raise NotMounted(
            "The control plane's URLs are not in the project's URLconf: add "
            'path("ops/", include("django_controlplane.urls")) (any prefix) '
            "to ROOT_URLCONF's urlpatterns."
        ) from None
