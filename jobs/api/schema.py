"""The OpenAPI document at ``/schema`` and the operators' docs at ``/schema/docs``.

Every route is served with and without a trailing slash; the document lists
each once, without it. The docs page is Swagger UI served from this
deployment's own static files (drf-spectacular-sidecar), so it works offline.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.templatetags.static import static
from drf_spectacular.renderers import (
    OpenApiJsonRenderer,
    OpenApiJsonRenderer2,
    OpenApiYamlRenderer,
    OpenApiYamlRenderer2,
)
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import IsAuthenticated


def drop_slash_twins(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: one entry per route and method, without the slash."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for path, path_regex, method, callback in endpoints:
        path = path.rstrip("/") or "/"
        if (path, method) in seen:
            continue
        seen.add((path, method))
        kept.append((path, path_regex, method, callback))
    return kept


class SchemaView(SpectacularAPIView):
    """OpenAPI 3 as JSON (``?format=yaml`` for YAML), for any signed-in user."""

    permission_classes = [IsAuthenticated]
    renderer_classes = [
        OpenApiJsonRenderer, OpenApiJsonRenderer2, OpenApiYamlRenderer, OpenApiYamlRenderer2
    ]
    custom_settings = {
        "PREPROCESSING_HOOKS": [drop_slash_twins],
        "COMPONENT_SPLIT_REQUEST": True,
    }


class SchemaDocsView(SpectacularSwaggerView):
    """Swagger UI over ``/schema``, its assets served locally; anonymous users sign in first."""

    url_name = "schema"

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
