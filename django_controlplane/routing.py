"""The control plane's WebSockets, ready to add to a project's ASGI application.

Consumers live with the face whose data they push (``dashboard.routing``,
``django_controlplane.remote.routing``); this puts them together under the same
prefix as ``include("django_controlplane.urls")``, behind the origin check
(``django_controlplane.remote.origin``) and Django's session and user (Channels'
``AuthMiddlewareStack``)::

    application = ProtocolTypeRouter({
        "http": ...,
        "websocket": controlplane_websockets(),  # at the prefix of the control plane's URLs
    })

``django_controlplane.asgi`` builds a project's whole application this way.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path

from dashboard.routing import websocket_urlpatterns as dashboard_routes
from django_controlplane.remote.origin import TokenOrOriginValidator
from django_controlplane.remote.routing import websocket_urlpatterns as remote_worker_routes

websocket_urlpatterns = [*dashboard_routes, *remote_worker_routes]


def controlplane_websockets(prefix: str | None = None, extra: list[Any] | None = None) -> Any:
    """The ASGI app for ``websocket`` connections: ours under ``prefix``, then ``extra``.

    ``prefix`` is the mount point of ``include("django_controlplane.urls")`` without its leading
    slash (``"ops/"``, or ``""`` at the root); by default it is read from the
    project's URLconf, so the two cannot disagree. ``extra`` takes a project's
    own WebSocket routes, which then share the same origin check and session.
    """
    if prefix is None:
        from django_controlplane.mount import mount_prefix

        prefix = mount_prefix().lstrip("/")
    ours: list[Any] = (
        [path(prefix, URLRouter(websocket_urlpatterns))] if prefix else list(websocket_urlpatterns)
    )
    return TokenOrOriginValidator(AuthMiddlewareStack(URLRouter([*ours, *(extra or [])])))
