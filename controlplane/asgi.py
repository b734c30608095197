"""ASGI entry point: HTTP (API, dashboard, static files) and WebSockets in one app.

``daphne controlplane.asgi:application`` serves it as one process;
``python manage.py serve`` runs one per core behind one port. Either way a
process takes its database connections from one bounded pool (set here,
before the settings load) and runs synchronous views on a fixed set of
threads (``jobs.web``).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("CONTROLPLANE_DB_POOL", "1")

import django  # noqa: E402

django.setup()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from jobs.routing import controlplane_websockets  # noqa: E402
from jobs.web.dispatch import HttpDispatcher  # noqa: E402
from jobs.web.lifespan import lifespan  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": HttpDispatcher(),
        "websocket": controlplane_websockets(),
        "lifespan": lifespan,
    }
)
