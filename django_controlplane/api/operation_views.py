"""``GET /operations``: what a client may enqueue, local and remote-declared alike."""

from __future__ import annotations

from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.base import ApiView, bounded, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.permissions import VIEW
from jobs.selectors.operations import LOCAL, REMOTE, operation_list


class OperationSerializer(serializers.Serializer):
    name = serializers.CharField()
    queue = serializers.CharField(help_text="The queue its jobs go to unless enqueue names one.")
    max_attempts = serializers.IntegerField()
    payload_schema = serializers.JSONField(help_text="JSON Schema (draft 2020-12) of the payload.")
    kind = serializers.CharField(
        help_text=f"'{LOCAL}': run by this deployment's workers; '{REMOTE}': declared by "
        "remote workers over HTTP."
    )
    description = serializers.CharField(allow_blank=True)
    online = serializers.BooleanField(help_text="A live worker serves it now.")
    enqueueable = serializers.BooleanField(
        help_text="POST /jobs accepts it now. A remote operation whose workers all left stays "
        "enqueueable for REMOTE_OPERATION_GRACE_SECONDS after last_seen_at; its jobs wait "
        "queued for the next worker."
    )
    last_seen_at = serializers.DateTimeField(
        allow_null=True, help_text="Remote only: when a worker declaring it was last alive."
    )


class OperationPageSerializer(serializers.Serializer):
    results = OperationSerializer(many=True)


class OperationListView(ApiView):
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="operations_list",
        summary="Every operation that can be enqueued, local and remote-declared",
        responses={200: OperationPageSerializer, **error_responses(401, 403, 503)},
    )
    @bounded
    def get(self, request: Request) -> Response:
        return Response({"results": OperationSerializer(operation_list(), many=True).data})
