"""Queue routes: every queue's figures, one queue, its limits, pause and resume."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api import actions
from django_controlplane.api.base import QUEUE_NAME, ApiView, bounded, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.permissions import CHANGE, VIEW
from django_controlplane.api.serializers import QueueLimitsSerializer, QueueSerializer
from jobs import operator_actions, selectors
from jobs.models import Queue, QueueKind
from jobs.queue_limits import CHECKS, FIELDS, LimitError


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
    required_permissions = {"GET": VIEW, "PATCH": CHANGE}

    @extend_schema(
        operation_id="queues_retrieve",
        summary="One queue",
        parameters=[QUEUE_NAME],
        responses={200: QueueSerializer, **error_responses(400, 401, 403)},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(_queue_json(selectors.queue_detail(_queue_name(name))))

    @extend_schema(
        operation_id="queues_partial_update",
        summary="Set or clear a queue's concurrency cap and rate limit",
        description=(
            "Both limits hold across every worker, local and remote. A field left out "
            "keeps its value; null clears it. Recorded in the operators' audit log."
        ),
        parameters=[QUEUE_NAME],
        request=QueueLimitsSerializer,
        responses={200: QueueSerializer, **error_responses(400, 401, 403)},
    )
    def patch(self, request: Request, name: str) -> Response:
        name = _queue_name(name)
        changes = _limits(self.body(request), name)
        # The domain services every face uses: the same writes and the same audit rows.
        with transaction.atomic():
            if "concurrency_cap" in changes:
                operator_actions.set_concurrency_cap(
                    name, changes["concurrency_cap"], user=request.user
                )
            if "rate_limit_per_second" in changes:
                operator_actions.set_rate_limit(
                    name, changes["rate_limit_per_second"], user=request.user
                )
        return Response(_queue_json(selectors.queue_detail(name)))


def _limits(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The limits a PATCH body sets, checked (``jobs.queue_limits``), or a 400 naming each field."""
    errors: dict[str, list[str]] = {
        str(field): ["This field is not known; a queue's limits are " + ", ".join(FIELDS) + "."]
        for field in sorted(set(body) - set(FIELDS), key=str)[:10]
    }
    changes: dict[str, Any] = {}
    for field in FIELDS:
        if field in body:
            try:
                changes[field] = CHECKS[field](body[field])
            except LimitError as error:
                errors[field] = [str(error)]
    if changes.get("rate_limit_per_second") is not None:
        kind = Queue.objects.filter(name=name).values_list("kind", flat=True).first()
        if (kind or Queue.default_kind(name)) == QueueKind.BATCH:
            errors["rate_limit_per_second"] = [
                "Rate limits apply to job queues; this is a batch queue."
            ]
    if not errors and not changes:
        errors["non_field_errors"] = ["Give concurrency_cap, rate_limit_per_second or both."]
    if errors:
        raise ValidationError(errors)
    return changes


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
        actions.set_queue_paused(_queue_name(name), self.paused, user=request.user)
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
