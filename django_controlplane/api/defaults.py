"""The REST API's own DRF choices, set on its views rather than in ``REST_FRAMEWORK``.

A host project's ``REST_FRAMEWORK`` settings (JWT authentication, throttles,
the browsable API, another exception handler) are for its own views; the
control plane's routes keep one behaviour wherever they are mounted, and the
host's other views keep theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema as spectacular_extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer

from django_controlplane.api.authentication import CachedTokenAuthentication
from django_controlplane.api.errors import exception_handler
from django_controlplane.api.parsers import LimitedJSONParser


class ApiDefaults:
    """Mixed in before ``APIView`` by every view of the API."""

    authentication_classes = [CachedTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]
    parser_classes = [LimitedJSONParser]
    throttle_classes: list[Any] = []
    versioning_class = None
    schema = AutoSchema()

    def get_exception_handler(self) -> Callable[..., Any]:
        return exception_handler


def extend_schema(**kwargs: Any) -> Callable[[Any], Any]:
    """drf-spectacular's ``extend_schema``, based on its ``AutoSchema`` whatever the host's
    ``DEFAULT_SCHEMA_CLASS`` is (on a view method it would otherwise start from that setting)."""

    def decorate(target: Any) -> Any:
        if getattr(target, "schema", None) is None:
            target.schema = AutoSchema
        return spectacular_extend_schema(**kwargs)(target)

    return decorate
