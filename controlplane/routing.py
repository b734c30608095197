"""WebSocket routes. Consumers live with the app whose data they push."""

from dashboard.routing import websocket_urlpatterns as dashboard_routes
from jobs.remote_routing import websocket_urlpatterns as remote_worker_routes

websocket_urlpatterns = [*dashboard_routes, *remote_worker_routes]
