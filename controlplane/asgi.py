"""ASGI entry point: HTTP (API, dashboard, static files) and WebSockets in one app."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from controlplane.routing import websocket_urlpatterns  # noqa: E402
from jobs.remote.origin import TokenOrOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": TokenOrOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
