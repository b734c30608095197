"""The ASGI application of a project that serves the control plane.

A host project's ``asgi.py`` (and ``settings.ASGI_APPLICATION``, which
``configure`` points here) uses it as it is::

    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django_controlplane.asgi import application  # noqa: E402

It serves the whole project, not only the control plane: every HTTP request
goes through ``django_controlplane.web.dispatch.HttpDispatcher`` (sync views on a fixed set of
web threads, async views on the event loop), WebSockets through Channels
(ours under the URLconf's prefix, then the project's own), and the lifespan
closes the database pool at shutdown. The process takes its database
connections from one bounded pool (``CONTROLPLANE_DB_POOL``, set here before
the settings load). A project with WebSocket routes of its own builds its
application with ``make_application(websockets=[...])``.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("CONTROLPLANE_DB_POOL", "1")

import django  # noqa: E402

django.setup()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from django_controlplane.routing import controlplane_websockets  # noqa: E402
from django_controlplane.web.dispatch import HttpDispatcher  # noqa: E402
from django_controlplane.web.lifespan import lifespan  # noqa: E402


def make_application(websockets: list[Any] | None = None) -> ProtocolTypeRouter:
    """HTTP, WebSockets (ours, then ``websockets``: a project's own routes) and lifespan."""
    return ProtocolTypeRouter(
        {
            "http": HttpDispatcher(),
            "websocket": controlplane_websockets(extra=websockets),
            "lifespan": lifespan,
        }
    )


application = make_application()
