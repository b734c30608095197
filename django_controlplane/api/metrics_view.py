"""``GET /metrics``: the Prometheus text format, authenticated like the rest of the API.

Who may scrape: a user holding ``controlplane.view_job`` (a token or a
session, as for every read of the API), or whoever sends
``Authorization: Bearer <METRICS_TOKEN>`` when that knob is set (a secret
for Prometheus that is no user's). Every figure is read from the database
at scrape time (``jobs.metrics.collector``) under the API's statement
timeout, so any web process answers the same.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.db import DatabaseError
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse
from prometheus_client import CollectorRegistry, exposition, generate_latest
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from django_controlplane.api.authentication import CachedTokenAuthentication
from django_controlplane.api.base import ApiView, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.errors import error_response
from django_controlplane.api.permissions import VIEW
from jobs import replica
from jobs.conf import knob
from jobs.metrics.collector import DatabaseCollector
from jobs.selectors.timeouts import bounded_reads, is_timeout

# The classic text format (what Prometheus has always scraped); our names need
# no escaping, so it says the same as the newer 1.0.0 one.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)


class MetricsSecret:
    """``request.auth`` of a scrape authenticated by the ``METRICS_TOKEN`` secret."""


METRICS_SECRET = MetricsSecret()


class MetricsTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer <METRICS_TOKEN>``; other schemes are left to the next class."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer":
            return None
        secret = str(knob("METRICS_TOKEN") or "").encode()
        if not secret:
            raise AuthenticationFailed(
                "This server has no METRICS_TOKEN: set CONTROLPLANE['METRICS_TOKEN'], "
                "or send 'Authorization: Token <key>' of a user who may view jobs."
            )
        if len(parts) != 2 or not hmac.compare_digest(parts[1], secret):
            raise AuthenticationFailed("The bearer token is not this server's METRICS_TOKEN.")
        return AnonymousUser(), METRICS_SECRET

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="metrics"'


class CanScrape(BasePermission):
    """The metrics secret, or a user holding the API's read permission."""

    message = f"You need the '{VIEW}' permission (or the METRICS_TOKEN) to read metrics."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.auth is METRICS_SECRET:
            return True
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(VIEW))


class MetricsView(ApiView):
    authentication_classes = [
        CachedTokenAuthentication,
        MetricsTokenAuthentication,
        SessionAuthentication,
    ]
    permission_classes = [CanScrape]

    @extend_schema(
        operation_id="metrics",
        summary="Prometheus metrics (text format), read from the database",
        description=(
            "Jobs by queue and state, oldest ready job per queue, workers alive, batch "
            "messages, schedule lag, and per queue and operation the started, succeeded, "
            "failed, retried and cancelled totals, lease expiries, reaper rescues and "
            "wait and run time histograms, and flow keys' held-back jobs and keys at their "
            "limit by queue and key family (docs/observability.md). Also accepts "
            "'Authorization: Bearer <METRICS_TOKEN>'."
        ),
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="Metrics."),
            **error_responses(401, 403, 503),
        },
        tags=["metrics"],
    )
    def get(self, request: Request) -> HttpResponse:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DatabaseCollector())

        def read() -> bytes:  # from the read replica when there is one (jobs.replica)
            with bounded_reads(replica.read_alias()):  # the API's statement timeout
                return generate_latest(registry)

        try:
            body = replica.on_replica(read, request)
        except DatabaseError as error:
            if not is_timeout(error):
                raise
            return error_response(
                "Reading the metrics took longer than the server allows "
                "(DASHBOARD_STATEMENT_TIMEOUT_MS); try again.",
                503,
            )
        return HttpResponse(body, content_type=CONTENT_TYPE)
