"""Job routes of the REST API: thin views over ``jobs.selectors``, ``jobs.enqueue`` and
``jobs.transitions``.

Each view names the permission each method needs (``django_controlplane.api.permissions``).
``POST /jobs/<id>/events`` belongs to the remote-worker protocol and is handed
to ``django_controlplane.remote.views``. Queues are in ``queue_views``, workers in
``worker_views``.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import Any, TypedDict

from django.db import DatabaseError, connections
from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from django_controlplane.api import actions
from django_controlplane.api.base import (
    FILTER_PARAMETERS,
    JOB_ID,
    ApiView,
    error_responses,
    remote_body,
)
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.errors import error_response
from django_controlplane.api.long_poll import WAIT_PARAMETER, park
from django_controlplane.api.permissions import ADD, CHANGE, REMOTE, VIEW
from django_controlplane.api.serializers import (
    BulkActionSerializer,
    BulkResultSerializer,
    EnqueuedJobSerializer,
    EnqueueSerializer,
    EventCreatedSerializer,
    EventPageSerializer,
    JobDetailSerializer,
    JobPageSerializer,
    JobSerializer,
    ReasonSerializer,
    represent,
    represent_many,
    sql_document,
    validated,
)
from django_controlplane.api.waiters import JOB, JOB_ENDED
from django_controlplane.remote import views as remote_views
from jobs import operator_actions, replica, selectors
from jobs.enqueue import enqueue
from jobs.selectors.timeouts import bounded_reads, is_timeout

# As ``django_controlplane.api.base.bounded`` answers a read past the statement timeout.
TIMEOUT_MESSAGE = (
    "The query took longer than the server allows; narrow the filters "
    "(status, queue, parent, created_after/created_before are index-backed) and try again."
)

# --- jobs ---------------------------------------------------------------------------


class JobListView(ApiView):
    query_parameters = (*selectors.FILTER_KEYS, "cursor", "limit", "count")
    required_permissions = {"GET": VIEW, "POST": ADD}

    @extend_schema(
        operation_id="jobs_list",
        summary="List jobs, newest first",
        parameters=[
            *FILTER_PARAMETERS,
            OpenApiParameter("cursor", OpenApiTypes.STR, description="From the previous 'next'."),
            OpenApiParameter(
                "limit",
                OpenApiTypes.INT,
                description=f"Page size, 1 to {selectors.MAX_PAGE_SIZE} "
                f"(default {selectors.DEFAULT_PAGE_SIZE}).",
            ),
            OpenApiParameter(
                "count",
                OpenApiTypes.BOOL,
                description="Count the matching jobs (default: on the first "
                "page only, not on pages reached by a cursor).",
            ),
        ],
        responses={200: JobPageSerializer, **error_responses(400, 401, 403, 503)},
    )
    def get(self, request: Request) -> HttpResponseBase:
        # ``bounded`` (base.py) for this view, without its read transaction: outside
        # one, the page travels with its read limits in one round trip
        # (``bounded_fetchall``) and a count that runs opens its own.
        def read() -> HttpResponseBase:
            alias = replica.read_alias()
            connection = connections[alias]
            one_trip = connection.vendor == "postgresql" and not connection.in_atomic_block
            try:
                with nullcontext() if one_trip else bounded_reads(alias):
                    return self._list(request, bounded=one_trip)
            except DatabaseError as error:
                if not is_timeout(error):
                    raise
                return error_response(TIMEOUT_MESSAGE, 503)

        return replica.on_replica(read, request)

    def _list(self, request: Request, *, bounded: bool) -> HttpResponseBase:
        params = request.query_params
        filters = selectors.job_filters_from_query(params)
        limit = selectors.parse_limit(
            params.get("limit"),
            default=selectors.DEFAULT_PAGE_SIZE,
            maximum=selectors.MAX_PAGE_SIZE,
        )
        cursor = params.get("cursor") or None
        wanted = _flag(params.get("count"), "count", default=cursor is None)
        # On PostgreSQL the database writes each job's JSON (sql_document): the same
        # objects JobSerializer gives, without 50 model instances represented in Python.
        document = sql_document(JobSerializer)
        page = selectors.job_list(filters, cursor, limit, document=document, bounded=bounded)
        # A count costs up to COUNT_CAP rows: worth it once per listing, not per page,
        # and a dear one is reused for COUNT_CACHE_SECONDS (pollers of a big list).
        count = selectors.job_count(filters, bounded=bounded) if wanted else None
        next_url = (
            replace_query_param(request.build_absolute_uri(), "cursor", page.next_cursor)
            if page.next_cursor
            else None
        )
        rest = {
            "next": next_url,
            "count": count.value if count else None,
            "count_capped": count.capped if count else False,
            "count_estimate": count.estimate if count else None,
        }
        if page.documents is not None:
            return _json_page(page.documents, rest)
        return Response({"results": represent_many(JobSerializer, page.results), **rest})

    @extend_schema(
        operation_id="jobs_enqueue",
        summary="Enqueue a job",
        description=(
            "Needs controlplane.add_job. 201 with the new job and duplicate false; while "
            "another job holds the unique_key (or idempotency_key), 200 with that job and "
            "duplicate true, and nothing is stored."
        ),
        request=EnqueueSerializer,
        responses={
            201: EnqueuedJobSerializer,
            200: EnqueuedJobSerializer,
            **error_responses(400, 401, 403, 413),
        },
    )
    def post(self, request: Request) -> Response:
        data = dict(validated(EnqueueSerializer, self.body(request)))
        operation = data.pop("operation")
        payload = data.pop("payload", None)
        payload = {} if payload is None else payload
        options = {name: value for name, value in data.items() if value is not None}
        # The job as stored (enqueue builds it from the row it inserted), or the
        # holder of its unique key, just read from the database.
        job = enqueue(operation, payload, **options)
        answer = status.HTTP_200_OK if job.duplicate else status.HTTP_201_CREATED
        return Response(represent(EnqueuedJobSerializer, job), status=answer)


class JobDetailView(ApiView):
    """``GET /jobs/<id>``, served by ``long_poll_view``: ``?wait=S`` answers when it ends."""

    query_parameters = ("wait",)
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="jobs_retrieve",
        summary="One job, with its children counted by state",
        description=(
            "With ?wait=S, answers the moment the job ends (succeeded, failed or "
            "cancelled), or after S seconds with its state then."
        ),
        parameters=[JOB_ID, WAIT_PARAMETER],
        responses={200: JobDetailSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.job_or_404(job_id)
        job.children_counts = selectors.job_children_counts(job.pk)
        response = Response(represent(JobDetailSerializer, job))
        return park(request, response, JOB, job.pk, job.status in JOB_ENDED)


# The timeline's cursor: every page of a job's events (``/events``, ``/logs``) takes it.
EVENT_CURSOR = [
    OpenApiParameter("after", OpenApiTypes.INT, description="A seq (default 0)."),
    OpenApiParameter(
        "limit",
        OpenApiTypes.INT,
        description=f"At most this many (1 to {selectors.MAX_EVENT_LIMIT}, "
        f"default {selectors.DEFAULT_EVENT_LIMIT}).",
    ),
]


def event_cursor(request: Request) -> tuple[int, int]:
    """``after`` and ``limit`` of a timeline page; a 400 naming the field otherwise."""
    raw = request.query_params.get("after")
    after = 0
    if raw not in (None, ""):
        try:
            after = int(raw)
        except ValueError:
            raise ValidationError({"after": ["'after' must be a whole number (a seq)."]}) from None
        if after < 0:
            raise ValidationError({"after": ["'after' must be 0 or more."]})
    limit = selectors.parse_limit(
        request.query_params.get("limit"),
        default=selectors.DEFAULT_EVENT_LIMIT,
        maximum=selectors.MAX_EVENT_LIMIT,
    )
    return after, limit


class JobEventsView(ApiView):
    query_parameters = ("after", "limit")
    required_permissions = {"GET": VIEW, "POST": REMOTE}

    @extend_schema(
        operation_id="jobs_events_list",
        summary="A job's timeline after a seq",
        description=(
            "Events with seq > after, ascending. Poll again with after=last_seq: "
            "no event is ever missed or repeated."
        ),
        parameters=[JOB_ID, *EVENT_CURSOR],
        responses={200: EventPageSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, job_id: str) -> Response:
        # Not @bounded: the read is one primary-key lookup joined to a range of the
        # unique (job, seq) index, so it cannot run long, and pollers call this
        # often: the timeout's BEGIN / SET LOCAL / COMMIT would be most of its round trips.
        pk = self.job_id(job_id)
        after, limit = event_cursor(request)
        page = selectors.job_events_page(pk, after, limit)
        if page is None:
            raise NotFound(f"No job with id {job_id} exists.")
        last, events = page
        # Never past the real end: a client that sent a bad 'after' resumes
        # from the last event that exists and misses none written later.
        last_seq = events[-1].seq if events else min(after, last)
        return Response(
            {
                "results": [_event_json(e) for e in events],
                "last_seq": last_seq,
                "has_more": len(events) == limit,
            }
        )

    @extend_schema(
        operation_id="jobs_events_create",
        summary="Remote worker: emit an event on a held job",
        parameters=[JOB_ID],
        request=remote_body("EventBody"),
        responses={201: EventCreatedSerializer, **error_responses(400, 401, 403, 404, 409, 413)},
        tags=["remote workers"],
    )
    def post(self, request: Request, job_id: str) -> Response:
        return remote_views.post_event(request, job_id)


def _json_page(documents: list[str], rest: dict[str, Any]) -> HttpResponse:
    """``{"results": [...], **rest}`` as DRF's JSON renderer writes it, the results being
    JSON texts already (compact separators, U+2028 and U+2029 escaped as it escapes them)."""
    tail = json.dumps(rest, separators=(",", ":"), ensure_ascii=False)
    body = '{"results":[' + ",".join(documents) + "]," + tail[1:]
    body = body.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return HttpResponse(body.encode(), content_type="application/json")


def _flag(raw: str | None, name: str, *, default: bool) -> bool:
    """A yes/no query parameter (``true``/``false``, ``1``/``0``, ``yes``/``no``)."""
    if raw in (None, ""):
        return default
    value = str(raw).strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValidationError({name: [f"'{name}' must be true or false."]})


def _event_json(event: Any) -> dict[str, Any]:
    """An event as ``EventSerializer`` renders it, without its per-field overhead."""
    ts = event.ts.isoformat()
    return {
        "seq": event.seq,
        "ts": ts[:-6] + "Z" if ts.endswith("+00:00") else ts,
        "event": event.event,
        "level": event.level,
        "message": event.message,
        "fields": event.fields,
    }


class JobCancelView(ApiView):
    required_permissions = {"POST": CHANGE}

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job and its queued and running descendants",
        description="Idempotent: a terminal job is returned unchanged.",
        parameters=[JOB_ID],
        request=ReasonSerializer,
        responses={200: JobSerializer, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, job_id: str) -> Response:
        pk = self.job_id(job_id)
        reason = self._reason(request)
        operator_actions.cancel_job(pk, user=request.user, reason=reason)
        return Response(JobSerializer(self.job_or_404(str(pk))).data)

    def _reason(self, request: Request) -> str | None:
        serializer = ReasonSerializer(data=self.body(request))
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data.get("reason") or None


class JobRetryView(JobCancelView):
    @extend_schema(
        operation_id="jobs_retry",
        summary="Retry a failed or cancelled job",
        description="409 when the job is neither failed nor cancelled.",
        parameters=[JOB_ID],
        request=ReasonSerializer,
        responses={200: JobSerializer, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, job_id: str) -> Response:
        pk = self.job_id(job_id)
        operator_actions.retry_job(
            pk, user=request.user, reason=self._reason(request), refusal=True
        )
        return Response(JobSerializer(self.job_or_404(str(pk))).data)


class BulkActionView(ApiView):
    """``POST /jobs/cancel`` and ``POST /jobs/retry``: a filter body, done in batches."""

    required_permissions = {"POST": CHANGE}
    bulk_action = staticmethod(actions.bulk_cancel)

    def post(self, request: Request) -> Response:
        body = self.body(request)
        serializer = BulkActionSerializer(data=body)
        serializer.is_valid(raise_exception=True)
        filters = selectors.job_filters_from_query(body, allow_ids=True)
        if filters.is_empty and serializer.validated_data.get("all") is not True:
            raise ValidationError(
                {
                    "all": [
                        "No filter was given: name the jobs (filters or 'ids'), "
                        'or send "all": true to act on every job.'
                    ]
                }
            )
        reason = serializer.validated_data.get("reason") or None
        changed = self.bulk_action(filters, user=request.user, reason=reason)
        return Response({"changed": changed})


class _BulkSchema(TypedDict):
    """The ``extend_schema`` arguments both bulk actions share.

    A plain dict would be ``dict[str, object]`` to mypy, which ``**`` cannot
    spread into ``extend_schema``'s typed keywords.
    """

    request: type[BulkActionSerializer]
    responses: dict[int, Any]


_BULK_SCHEMA: _BulkSchema = {
    "request": BulkActionSerializer,
    "responses": {200: BulkResultSerializer, **error_responses(400, 401, 403, 413)},
}


class BulkCancelView(BulkActionView):
    bulk_action = staticmethod(actions.bulk_cancel)

    @extend_schema(
        operation_id="jobs_bulk_cancel",
        summary="Cancel every job matching a filter",
        **_BULK_SCHEMA,
    )
    def post(self, request: Request) -> Response:
        return super().post(request)


class BulkRetryView(BulkActionView):
    bulk_action = staticmethod(actions.bulk_retry)

    @extend_schema(
        operation_id="jobs_bulk_retry",
        summary="Retry every failed or cancelled job matching a filter",
        **_BULK_SCHEMA,
    )
    def post(self, request: Request) -> Response:
        return super().post(request)
