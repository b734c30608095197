"""WebSocket routes. Consumers live with the app whose data they push."""

websocket_urlpatterns: list = []
