"""The control plane's WebSockets, ready to add to a project's ASGI application.

Consumers live with the app whose data they push (``dashboard.routing``,
``jobs.remote_routing``); this puts them together under the same prefix as
``include("jobs.urls")``, behind the origin check (``jobs.remote.origin``) and
Django's session and user (Channels' ``AuthMiddlewareStack``)::

    # asgi.py of a host project that mounts the control plane at "ops/"
    application = ProtocolTypeRouter({
        "http": django_asgi_app,
        "websocket": controlplane_websockets("ops/"),
    })
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path

from dashboard.routing import websocket_urlpatterns as dashboard_routes
from jobs.remote.origin import TokenOrOriginValidator
from jobs.remote_routing import websocket_urlpatterns as remote_worker_routes

websocket_urlpatterns = [*dashboard_routes, *remote_worker_routes]


def controlplane_websockets(prefix: str = "", extra: list[Any] | None = None) -> Any:
    """The ASGI app for ``websocket`` connections: ours under ``prefix``, then ``extra``.

    ``prefix`` is the mount point of ``include("jobs.urls")`` without its leading
    slash (``"ops/"``, or ``""`` at the root); ``extra`` takes a project's own
    WebSocket routes, which then share the same origin check and session.
    """
    ours: list[Any] = (
        [path(prefix, URLRouter(websocket_urlpatterns))] if prefix else list(websocket_urlpatterns)
    )
    return TokenOrOriginValidator(AuthMiddlewareStack(URLRouter([*ours, *(extra or [])])))
