"""WebSocket routes for remote workers (/ws/workers/<id>)."""

from django.urls import re_path

from django_controlplane.remote.consumers import WorkerConsumer

websocket_urlpatterns = [
    re_path(r"^ws/workers/(?P<worker_id>[^/]+)/?$", WorkerConsumer.as_asgi()),
]
