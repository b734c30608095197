"""WebSocket routes of the dashboard."""

websocket_urlpatterns: list = []
