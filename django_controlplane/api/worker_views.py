"""Worker routes: the operators' view of workers, and the remote-worker methods on the same paths.

``POST /workers`` (register), ``PATCH /workers/<id>`` (heartbeat) and
``DELETE /workers/<id>`` (disconnect) are handed to ``django_controlplane.remote.views``.
"""

from __future__ import annotations

from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.base import WORKER_ID, ApiView, bounded, error_responses, remote_body
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.permissions import REMOTE, VIEW
from django_controlplane.api.serializers import (
    DisconnectResultSerializer,
    HeartbeatResultSerializer,
    RemoteWorkerSerializer,
    WorkerSerializer,
)
from django_controlplane.remote import views as remote_views
from jobs import selectors


class WorkerListView(ApiView):
    required_permissions = {"GET": VIEW, "POST": REMOTE}

    @extend_schema(
        operation_id="workers_list",
        summary="Every worker with its running jobs",
        responses={200: WorkerSerializer(many=True), **error_responses(401, 403, 503)},
    )
    @bounded
    def get(self, request: Request) -> Response:
        return Response(WorkerSerializer(selectors.worker_list(), many=True).data)

    @extend_schema(
        operation_id="workers_register",
        summary="Remote worker: register",
        request=remote_body("RegisterBody"),
        responses={201: RemoteWorkerSerializer, **error_responses(400, 401, 403, 413)},
        tags=["remote workers"],
    )
    def post(self, request: Request) -> Response:
        return remote_views.register_worker(request)


class WorkerDetailView(ApiView):
    required_permissions = {"GET": VIEW, "PATCH": REMOTE, "DELETE": REMOTE}

    @extend_schema(
        operation_id="workers_retrieve",
        summary="One worker",
        parameters=[WORKER_ID],
        responses={200: WorkerSerializer, **error_responses(401, 403, 404)},
    )
    def get(self, request: Request, worker_id: str) -> Response:
        info = selectors.worker_detail(worker_id)
        if info is None:
            raise NotFound(f"No worker with id {worker_id} exists.")
        return Response(WorkerSerializer(info).data)

    @extend_schema(
        operation_id="workers_heartbeat",
        summary="Remote worker: heartbeat",
        parameters=[WORKER_ID],
        request=remote_body("HeartbeatBody"),
        responses={200: HeartbeatResultSerializer, **error_responses(400, 401, 403, 404, 413)},
        tags=["remote workers"],
    )
    def patch(self, request: Request, worker_id: str) -> Response:
        return remote_views.heartbeat_worker(request, worker_id)

    @extend_schema(
        operation_id="workers_disconnect",
        summary="Remote worker: disconnect",
        parameters=[WORKER_ID],
        request=None,
        responses={200: DisconnectResultSerializer, **error_responses(401, 403, 404)},
        tags=["remote workers"],
    )
    def delete(self, request: Request, worker_id: str) -> Response:
        return remote_views.disconnect_worker(request, worker_id)
