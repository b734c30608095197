"""``/jobs/<id>/logs``: a job's execution log, read with the timeline's cursor, and
written by the remote worker that holds the job (``django_controlplane.remote.logs``)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.base import JOB_ID, ApiView, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.permissions import REMOTE, VIEW
from django_controlplane.api.serializers import EventPageSerializer
from django_controlplane.api.views import EVENT_CURSOR, _event_json, event_cursor
from django_controlplane.remote import logs as remote_logs
from jobs.job_logs import job_log_page


class JobLogsView(ApiView):
    query_parameters = ("after", "limit")
    required_permissions = {"GET": VIEW, "POST": REMOTE}

    @extend_schema(
        operation_id="jobs_logs_list",
        summary="A job's execution log after a seq",
        description=(
            "The job.log and job.log_truncated events of the timeline with seq > after, "
            "ascending. Poll again with after=last_seq: no record is missed or repeated. "
            "The seqs are the timeline's, so a cursor from /events works here and back."
        ),
        parameters=[JOB_ID, *EVENT_CURSOR],
        responses={200: EventPageSerializer, **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request, job_id: str) -> Response:
        pk = self.job_id(job_id)
        after, limit = event_cursor(request)
        page = job_log_page(pk, after=after, limit=limit)
        if page is None:
            raise NotFound(f"No job with id {job_id} exists.")
        last_seq, events = page
        return Response(
            {
                "results": [_event_json(e) for e in events],
                "last_seq": last_seq,
                "has_more": len(events) == limit,
            }
        )

    @extend_schema(
        operation_id="jobs_logs_create",
        summary="Remote worker: append log records to a held job",
        parameters=[JOB_ID],
        request=remote_logs.LogsBody,
        responses={201: OpenApiTypes.OBJECT, **error_responses(400, 401, 403, 404, 409, 413)},
        tags=["remote workers"],
    )
    def post(self, request: Request, job_id: str) -> Response:
        return remote_logs.post_logs(request, job_id)
