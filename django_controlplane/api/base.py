"""What every API view shares: the base view, and the schema pieces they describe themselves with.

``ApiView`` gives JSON in and out, bounded bodies and one permission per
method (``django_controlplane.api.permissions``); its helpers turn a path id into a job or a
clean 404 and read the body as a JSON object or refuse it.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_controlplane.api.defaults import ApiDefaults
from django_controlplane.api.errors import error_response
from django_controlplane.api.parsers import LimitedJSONParser
from django_controlplane.api.permissions import MethodPermission
from django_controlplane.api.serializers import ErrorSerializer
from django_controlplane.remote import views as remote_views
from jobs import replica, selectors
from jobs.models import Job
from jobs.selectors.timeouts import bounded_reads, is_timeout


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    described = {
        400: "The request is invalid (see 'errors').",
        401: "Not authenticated.",
        403: "Authenticated, but without the permission this needs.",
        404: "No such job, queue or worker.",
        409: "The job is not in a state that allows this.",
        413: "The request body is too large.",
        503: "The read took longer than the statement timeout (PostgreSQL); "
        "narrow the filters (see the index-backed ones) and try again.",
    }
    return {code: OpenApiResponse(ErrorSerializer, description=described[code]) for code in codes}


def remote_body(name: str) -> Any:
    """A request serializer of the remote-worker protocol, for the schema only."""
    return getattr(remote_views, name, OpenApiTypes.OBJECT)


def bounded(method: Callable[..., Response]) -> Callable[..., Response]:
    """Run a read-only view method under the statement timeout; a timeout becomes a 503.

    On PostgreSQL every query of the method (page, count, lookups) runs in one
    read transaction with ``SET LOCAL statement_timeout`` (``jobs.selectors.timeouts``),
    so a filter that no index serves on a big table costs at most the timeout
    instead of holding a connection for minutes. SQLite has no statement
    timeout: there the reads run as they are. The knob
    (``DASHBOARD_STATEMENT_TIMEOUT_MS``) is the dashboard's too, so one
    setting bounds every read an operator can trigger. The reads go to the
    read replica when one is configured and fresh (``jobs.replica``): only
    list views are ``bounded``.
    """

    @functools.wraps(method)
    def wrapped(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        def read() -> Response:
            try:
                with bounded_reads(replica.read_alias()):
                    return method(self, request, *args, **kwargs)
            except DatabaseError as error:
                if not is_timeout(error):
                    raise
                return error_response(
                    "The query took longer than the server allows; narrow the filters "
                    "(status, queue, parent, created_after/created_before are index-backed) "
                    "and try again.",
                    503,
                )

        return replica.on_replica(read, request)

    return wrapped


JOB_ID = OpenApiParameter("job_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
WORKER_ID = OpenApiParameter("worker_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
QUEUE_NAME = OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH)
FILTER_PARAMETERS = [
    OpenApiParameter(
        "status",
        OpenApiTypes.STR,
        many=True,
        explode=True,
        enum=list(selectors.STATES),
        description="One or more states (repeat the key or separate by commas).",
    ),
    OpenApiParameter("queue", OpenApiTypes.STR, description="One or more queues."),
    OpenApiParameter("operation", OpenApiTypes.STR, description="One or more operations."),
    OpenApiParameter(
        "parent",
        OpenApiTypes.STR,
        description="A parent job id, or 'none' for top-level jobs only.",
    ),
    OpenApiParameter(
        "created_after", OpenApiTypes.DATETIME, description="Created at or after this time."
    ),
    OpenApiParameter(
        "created_before", OpenApiTypes.DATETIME, description="Created before this time."
    ),
    OpenApiParameter(
        "q", OpenApiTypes.STR, description="Free text over id (or id prefix), operation and error."
    ),
    OpenApiParameter("schedule", OpenApiTypes.UUID, description="The jobs this schedule fired."),
    OpenApiParameter("workflow", OpenApiTypes.UUID, description="The steps of this workflow."),
    OpenApiParameter("from", OpenApiTypes.DATETIME, description="As created_after."),
    OpenApiParameter("to", OpenApiTypes.DATETIME, description="As created_before."),
    OpenApiParameter(
        "range",
        OpenApiTypes.STR,
        enum=list(selectors.RANGES),
        description="Created in this last window (with created_after, the later bound counts).",
    ),
    OpenApiParameter(
        "when",
        OpenApiTypes.STR,
        enum=["scheduled", "retrying"],
        description="Queued jobs waiting for later: never run and due later (scheduled), "
        "or waiting to run again (retrying).",
    ),
    OpenApiParameter(
        "payload",
        OpenApiTypes.STR,
        description='A JSON object the payload contains, e.g. {"account": 42} (on PostgreSQL '
        "by containment; on SQLite each top-level key must match exactly).",
    ),
]


class ApiView(ApiDefaults, APIView):
    """JSON in and out, bounded bodies, one permission per method."""

    parser_classes = [LimitedJSONParser]
    permission_classes = [MethodPermission]
    required_permissions: dict[str, str] = {}
    # The query parameters the route reads; any other is a 400 rather than silently
    # ignored (``?after=`` sent to the list, ``?cursor=`` to the events…).
    query_parameters: tuple[str, ...] = ()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication and permission first
        unknown = sorted(set(request.query_params) - set(self.query_parameters))
        if unknown:
            takes = ", ".join(self.query_parameters) or "no query parameters"
            raise ValidationError(
                {
                    # backslashreplace: a lone surrogate in a name stays printable JSON
                    name[:60].encode("utf-8", "backslashreplace").decode(): [
                        f"Unknown query parameter; this route takes {takes}."
                    ]
                    for name in unknown[:10]
                }
            )

    @staticmethod
    def body(request: Request) -> dict[str, Any]:
        """The JSON body as an object (no body at all reads as ``{}``)."""
        data = request.data
        if not isinstance(data, dict):
            raise ValidationError({"non_field_errors": ["The request body must be a JSON object."]})
        return data

    @staticmethod
    def job_id(raw: str) -> uuid.UUID:
        """The job id of the URL; a value that is not a UUID names no job (404)."""
        job_id = selectors.parse_uuid(raw)
        if job_id is None:
            raise NotFound(f"No job with id {raw!r} exists; job ids are UUIDs.")
        return job_id

    @classmethod
    def job_or_404(cls, raw: str) -> Job:
        job = selectors.job_get(cls.job_id(raw))
        if job is None:
            raise NotFound(f"No job with id {raw} exists.")
        return job

    @staticmethod
    def actor(request: Request) -> str:
        return request.user.get_username()
