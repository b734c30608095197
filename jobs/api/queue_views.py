"""Queue routes: every queue's figures, one queue, pause and resume."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from jobs import selectors
from jobs.api import actions
from jobs.api.base import QUEUE_NAME, ApiView, bounded, error_responses
from jobs.api.defaults import extend_schema
from jobs.api.permissions import CHANGE, VIEW
from jobs.api.serializers import QueueSerializer


def _queue_json(stats: selectors.QueueStats) -> dict[str, Any]:
    return QueueSerializer(stats).data


class QueueListView(ApiView):
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="queues_list",
        summary="Every queue with its figures",
        responses={200: QueueSerializer(many=True), **error_responses(401, 403, 503)},
    )
    @bounded
    def get(self, request: Request) -> Response:
        return Response([_queue_json(q) for q in selectors.queue_stats()])


class QueueDetailView(ApiView):
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="queues_retrieve",
        summary="One queue",
        parameters=[QUEUE_NAME],
        responses={200: QueueSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(_queue_json(selectors.queue_detail(_queue_name(name))))


def _queue_name(name: str) -> str:
    if not name.strip() or len(name) > 200:
        raise ValidationError({"name": ["A queue name is 1 to 200 characters."]})
    reason = selectors.unstorable_text(name)
    if reason:
        raise ValidationError({"name": [reason]})
    return name


class QueuePauseView(ApiView):
    required_permissions = {"POST": CHANGE}
    paused = True

    @extend_schema(
        operation_id="queues_pause",
        summary="Stop claiming on a queue",
        parameters=[QUEUE_NAME],
        request=None,
        responses={200: QueueSerializer, **error_responses(400, 401, 403)},
    )
    def post(self, request: Request, name: str) -> Response:
        actions.set_queue_paused(_queue_name(name), self.paused)
        return Response(_queue_json(selectors.queue_detail(name)))


class QueueResumeView(QueuePauseView):
    paused = False

    @extend_schema(
        operation_id="queues_resume",
        summary="Restart claiming on a queue",
        parameters=[QUEUE_NAME],
        request=None,
        responses={200: QueueSerializer, **error_responses(400, 401, 403)},
    )
    def post(self, request: Request, name: str) -> Response:
        return super().post(request, name)
