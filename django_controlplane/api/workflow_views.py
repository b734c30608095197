"""Workflow routes: list, start, read (``?wait=S`` long-polls for its end), cancel; and what a job
waits for (``GET /jobs/<id>/dependencies``).

Thin views over ``django_controlplane.api.workflow_reads``, ``jobs.workflow_actions``
(start, audited) and ``jobs.operator_actions.cancel_workflow`` (audited). Reading
needs ``controlplane.view_job``; starting one ``controlplane.add_job`` (as
``POST /jobs``); cancelling one ``controlplane.change_job`` (as cancelling a job).
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from django_controlplane.api import workflow_reads
from django_controlplane.api.base import JOB_ID, ApiView, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.long_poll import WAIT_PARAMETER, park
from django_controlplane.api.permissions import ADD, CHANGE, VIEW
from django_controlplane.api.serializers import ReasonSerializer, represent
from django_controlplane.api.waiters import WORKFLOW, WORKFLOW_ENDED
from django_controlplane.api.workflow_serializers import (
    WORKFLOW_STATES,
    DependencyPageSerializer,
    WorkflowDetailSerializer,
    WorkflowPageSerializer,
    WorkflowSerializer,
    WorkflowSpecSerializer,
)
from jobs import operator_actions, selectors, workflow_actions
from jobs.models import Workflow

WORKFLOW_ID = OpenApiParameter("workflow_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
TAGS = ["workflows"]


def parse_workflow_id(raw: str) -> uuid.UUID:
    """The workflow id of the URL; a value that is not a UUID names no workflow (404)."""
    found = selectors.parse_uuid(raw)
    if found is None:
        raise NotFound(f"No workflow with id {raw!r} exists; workflow ids are UUIDs.")
    return found


def detail_json(request: Request, found: workflow_reads.WorkflowDetail) -> dict[str, Any]:
    body = represent(WorkflowSerializer, found.workflow)
    body["counts"] = found.counts
    body["steps"] = [
        {
            "id": str(s["id"]),
            "step": s["step"],
            "operation": s["operation"],
            "status": s["status"],
            "waiting_for": s["waiting_for"],
            "depends_on": s.get("depends_on", []),
            "depends_on_count": s.get("depends_on_count", 0),
        }
        for s in found.steps
    ]
    body["steps_truncated"] = found.steps_truncated
    body["jobs"] = jobs_url(request, found.workflow.pk)
    return body


def jobs_url(request: Request, pk: uuid.UUID) -> str:
    """``GET /jobs?workflow=<id>`` under whatever prefix this API is mounted at."""
    path = request.path
    at = path.rfind("/workflows")
    head = path[:at] if at >= 0 else ""
    return request.build_absolute_uri(f"{head}/jobs?workflow={pk}")


def read_detail(request: Request, raw: str) -> dict[str, Any]:
    found = workflow_reads.workflow_detail(parse_workflow_id(raw))
    if found is None:
        raise NotFound(f"No workflow with id {raw} exists.")
    return detail_json(request, found)


class WorkflowListView(ApiView):
    query_parameters = ("status", "name", "cursor", "limit")
    required_permissions = {"GET": VIEW, "POST": ADD}

    @extend_schema(
        operation_id="workflows_list",
        summary="List workflows, newest first",
        parameters=[
            OpenApiParameter(
                "status",
                OpenApiTypes.STR,
                many=True,
                explode=True,
                enum=WORKFLOW_STATES,
                description="One or more statuses (repeat the key or separate by commas).",
            ),
            OpenApiParameter("name", OpenApiTypes.STR, description="Exactly this name."),
            OpenApiParameter("cursor", OpenApiTypes.STR, description="From the previous 'next'."),
            OpenApiParameter(
                "limit",
                OpenApiTypes.INT,
                description=f"Page size, 1 to {workflow_reads.MAX_PAGE_SIZE} "
                f"(default {workflow_reads.DEFAULT_PAGE_SIZE}).",
            ),
        ],
        responses={200: WorkflowPageSerializer, **error_responses(400, 401, 403)},
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        filters = workflow_reads.workflow_filters(params)
        limit = selectors.parse_limit(
            params.get("limit"),
            default=workflow_reads.DEFAULT_PAGE_SIZE,
            maximum=workflow_reads.MAX_PAGE_SIZE,
        )
        page = workflow_reads.workflow_list(filters, params.get("cursor") or None, limit)
        next_url = (
            replace_query_param(request.build_absolute_uri(), "cursor", page.next_cursor)
            if page.next_cursor
            else None
        )
        return Response(
            {"results": [represent(WorkflowSerializer, w) for w in page.results], "next": next_url}
        )

    @extend_schema(
        operation_id="workflows_start",
        summary="Start a workflow: its steps and their dependencies, enqueued at once",
        description=(
            "Needs controlplane.add_job. Nothing is stored when any step is invalid: 400 "
            "with errors by field (steps.1.depends_on). Audited (start_workflow)."
        ),
        request=WorkflowSpecSerializer,
        responses={201: WorkflowDetailSerializer, **error_responses(400, 401, 403, 413)},
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        run = workflow_actions.start_workflow(self.body(request), user=request.user)
        return Response(read_detail(request, str(run.pk)), status=status.HTTP_201_CREATED)


class WorkflowDetailView(ApiView):
    query_parameters = ("wait",)
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="workflows_retrieve",
        summary="One workflow: its steps counted by status, and its first 1,000 steps",
        description=(
            "With ?wait=S, answers the moment the workflow ends (succeeded, failed or "
            "cancelled), or after S seconds with its state then."
        ),
        parameters=[WORKFLOW_ID, WAIT_PARAMETER],
        responses={200: WorkflowDetailSerializer, **error_responses(400, 401, 403, 404)},
        tags=TAGS,
    )
    def get(self, request: Request, workflow_id: str) -> Response:
        body = read_detail(request, workflow_id)
        ended = body["status"] in WORKFLOW_ENDED
        return park(request, Response(body), WORKFLOW, uuid.UUID(body["id"]), ended)


class WorkflowCancelView(ApiView):
    required_permissions = {"POST": CHANGE}

    @extend_schema(
        operation_id="workflows_cancel",
        summary="Cancel a workflow: its queued and running steps, with the reason",
        description="Idempotent: a workflow that has ended is returned unchanged. Audited.",
        parameters=[WORKFLOW_ID],
        request=ReasonSerializer,
        responses={200: WorkflowDetailSerializer, **error_responses(400, 401, 403, 404)},
        tags=TAGS,
    )
    def post(self, request: Request, workflow_id: str) -> Response:
        pk = parse_workflow_id(workflow_id)
        serializer = ReasonSerializer(data=self.body(request))
        serializer.is_valid(raise_exception=True)
        reason = serializer.validated_data.get("reason") or None
        try:
            operator_actions.cancel_workflow(pk, user=request.user, reason=reason)
        except Workflow.DoesNotExist:
            raise NotFound(f"No workflow with id {workflow_id} exists.") from None
        return Response(read_detail(request, str(pk)))


class JobDependenciesView(ApiView):
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="jobs_dependencies",
        summary="What a job waits for, with the results of those that succeeded",
        description=(
            f"At most {workflow_reads.MAX_DEPENDENCY_ROWS:,} dependencies (truncated says "
            "when there are more). Results are included while together they are at most "
            "MAX_DEPENDENCY_RESULTS_BYTES (16 MiB) of JSON, the bound a step's "
            "ctx.dependency_results() has; past it none is, and results_omitted says why."
        ),
        parameters=[JOB_ID],
        responses={200: DependencyPageSerializer, **error_responses(401, 403, 404)},
        tags=["jobs"],
    )
    def get(self, request: Request, job_id: str) -> Response:
        job = self.job_or_404(job_id)
        page = workflow_reads.job_dependencies(job.pk)
        for row in page.results:
            row["id"] = str(row["id"])
        return Response(
            {
                "results": page.results,
                "truncated": page.truncated,
                "results_omitted": page.results_omitted,
            }
        )
