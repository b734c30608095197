"""WebSocket routes for remote workers (/ws/workers/<id>)."""

websocket_urlpatterns: list = []
