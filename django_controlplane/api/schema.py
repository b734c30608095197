"""The OpenAPI document at ``/schema`` and the operators' docs at ``/schema/docs``.

Every route is served with and without a trailing slash; the document lists
each once, without it. The docs page is Swagger UI served from this
deployment's own static files (drf-spectacular-sidecar), so it works offline.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.templatetags.static import static
from drf_spectacular.extensions import OpenApiViewExtension
from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.renderers import JSONRenderer, TemplateHTMLRenderer

from django_controlplane.api.defaults import ApiDefaults, extend_schema


def control_plane_routes(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: the control plane's routes only (not a host
    project's own), one entry per route and method, without the slash."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for path, path_regex, method, callback in endpoints:
        if not getattr(callback, "cls", type).__module__.startswith(
            ("django_controlplane.api.", "django_controlplane.remote.")
        ):
            continue
        path = path.rstrip("/") or "/"
        if (path, method) in seen:
            continue
        seen.add((path, method))
        kept.append((path, path_regex, method, callback))
    return kept


class SchemaView(ApiDefaults, SpectacularAPIView):
    """OpenAPI 3 as JSON (``?format=yaml`` for YAML), for any signed-in user."""

    permission_classes = [IsAuthenticated]
    renderer_classes = [
        OpenApiJsonRenderer,
        OpenApiJsonRenderer2,
        OpenApiYamlRenderer,
        OpenApiYamlRenderer2,
    ]
    custom_settings = {
        "TITLE": "Job control plane API",
        "DESCRIPTION": "Enqueue, inspect, cancel and retry jobs; run remote workers.",
        "VERSION": "1.0.0",
        "PREPROCESSING_HOOKS": ["django_controlplane.api.schema.control_plane_routes"],
        "COMPONENT_SPLIT_REQUEST": True,
    }

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def handle_exception(self, exc):
        """Errors (401, 403, 405) in the API's JSON shape, not as an OpenAPI media type."""
        response = super().handle_exception(exc)
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return response


class SchemaDocsView(ApiDefaults, SpectacularSwaggerView):
    """Swagger UI over ``/schema``, its assets served locally; anonymous users sign in first."""

    url_name = "controlplane_api:schema"
    renderer_classes = [TemplateHTMLRenderer]
    permission_classes = [AllowAny]

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        if not (request.user and request.user.is_authenticated):
            return redirect_to_login(request.get_full_path())
        return super().get(request, *args, **kwargs)

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return static(f"drf_spectacular_sidecar/swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return static("drf_spectacular_sidecar/swagger-ui-dist/favicon-32x32.png")


# --- the remote workers' own routes ------------------------------------------------
# ``django_controlplane.remote.views`` owns complete and fail; until those views
# carry their own ``extend_schema``, these extensions describe them from the
# body serializers they validate with, so /schema lists every route.


def _remote_post_extension(
    view: str,
    operation_id: str,
    summary: str,
    body: str,
    parameter: OpenApiParameter,
    response: str,
) -> type[OpenApiViewExtension]:
    class RemoteRouteSchema(OpenApiViewExtension):
        target_class = f"django_controlplane.remote.views.{view}"

        def view_replacement(self):
            if "schema" in getattr(self.target.post, "kwargs", {}):
                return self.target  # already annotated where it is defined

            from django_controlplane.api import serializers
            from django_controlplane.api.base import error_responses
            from django_controlplane.remote import views as remote_views

            class Described(self.target):
                @extend_schema(
                    operation_id=operation_id,
                    summary=summary,
                    tags=["remote workers"],
                    parameters=[parameter],
                    request=getattr(remote_views, body, OpenApiTypes.OBJECT),
                    responses={
                        200: getattr(serializers, response),
                        **error_responses(400, 401, 403, 404, 409, 413),
                    },
                )
                def post(self, request, *args, **kwargs):
                    return super().post(request, *args, **kwargs)

            return Described

    RemoteRouteSchema.__name__ = f"{view}Schema"
    return RemoteRouteSchema


_JOB_ID = OpenApiParameter("job_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
_WORKER_ID = OpenApiParameter("worker_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
REMOTE_ROUTE_SCHEMAS = [
    _remote_post_extension(
        "CompleteView",
        "jobs_complete",
        "Remote worker: complete a held job",
        "CompleteBody",
        _JOB_ID,
        "OutcomeSerializer",
    ),
    _remote_post_extension(
        "FailView",
        "jobs_fail",
        "Remote worker: fail a held job",
        "FailBody",
        _JOB_ID,
        "OutcomeSerializer",
    ),
]
