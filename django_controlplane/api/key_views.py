"""Flow key limit routes: every limit row, one row, set or change one, remove one.

A row is named after a key family (``account``) or one key (``account:42``);
a key obeys its own row if it has one, else its family's (``jobs.key_limits``).
Thin views over ``jobs.operator_actions.set_key_limits`` and
``delete_key_limits``, the audited services every face calls. Reading needs
``controlplane.view_job``, changes ``controlplane.change_job``, as for
``PATCH /queues/<name>``.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.base import ApiView, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.permissions import CHANGE, VIEW
from jobs import operator_actions
from jobs.key_limits import FIELDS, RULES, KeyLimitError, check_name
from jobs.models import Job, KeyLimit

TAGS = ["keys"]
KEY_NAME = OpenApiParameter(
    "name",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="A key family (account) or one key (account:42). A trailing slash is never "
    "part of the name.",
)


class KeyLimitSerializer(serializers.Serializer):
    """One limit row, as ``GET /keys`` lists it."""

    name = serializers.CharField(help_text="A key family (account) or one key (account:42).")
    concurrency = serializers.IntegerField(
        allow_null=True, help_text="Most jobs with the key running at once, or null."
    )
    rate = serializers.FloatField(
        allow_null=True, help_text="Jobs with the key started per second, or null."
    )
    burst = serializers.FloatField(
        allow_null=True, help_text="The rate bucket's size; null: one second's worth (at least 1)."
    )
    weight = serializers.FloatField(help_text="Turns per round of fair dispatch (default 1).")
    updated_at = serializers.DateTimeField()


class KeyLimitDetailSerializer(KeyLimitSerializer):
    """One limit row, and for one key how many of its jobs run now."""

    running = serializers.IntegerField(
        allow_null=True,
        help_text="Running jobs that carry this key; null for a family.",
    )


class KeyLimitsChangeSerializer(serializers.Serializer):
    """``PATCH /keys/<name>`` (schema only; the rules are ``jobs.key_limits``)."""

    concurrency = serializers.IntegerField(
        required=False, allow_null=True, help_text=RULES["concurrency"]
    )
    rate = serializers.FloatField(required=False, allow_null=True, help_text=RULES["rate"])
    burst = serializers.FloatField(required=False, allow_null=True, help_text=RULES["burst"])
    weight = serializers.FloatField(
        required=False, allow_null=True, help_text=RULES["weight"] + " Null sets it back to 1."
    )


def key_limit_json(row: KeyLimit) -> dict[str, Any]:
    return KeyLimitSerializer(row).data


def key_limit_detail_json(row: KeyLimit) -> dict[str, Any]:
    shown = dict(key_limit_json(row))
    shown["running"] = running_with_key(row.name) if ":" in row.name else None
    return shown


def running_with_key(key: str) -> int:
    """How many running jobs carry ``key`` among their flow keys.

    Only keyed jobs are looked at (``fair_key`` is set on every one, and a
    partial index holds the running ones); on SQLite, where a JSON column has
    no containment lookup, their keys are read and matched here: running
    keyed jobs are as few as the workers' slots.
    """
    running = Job.objects.filter(status="running", fair_key__isnull=False)
    if connections[running.db].vendor == "postgresql":
        return running.filter(flow_keys__contains=[key]).count()
    return sum(key in (keys or ()) for keys in running.values_list("flow_keys", flat=True))


def _name(raw: str) -> str:
    """The row name of the URL (one trailing slash is the route's, not the name's), or a 400."""
    name = raw[:-1] if raw.endswith("/") else raw
    try:
        return check_name(name)
    except KeyLimitError as error:
        raise ValidationError(error.errors) from None


def _row_or_404(name: str) -> KeyLimit:
    row = KeyLimit.objects.filter(name=name).first()
    if row is None:
        raise NotFound(f"No limits are set for {name!r}; PATCH /keys/<name> sets them.")
    return row


def _changes(body: dict[str, Any]) -> dict[str, Any]:
    """The fields a PATCH body names; unknown ones are a 400 (at most ten named)."""
    unknown = sorted(set(body) - set(FIELDS), key=str)
    if unknown:
        raise ValidationError(
            {
                str(field)[:60]: [
                    f"This field is not known; a key's limits are {', '.join(FIELDS)}."
                ]
                for field in unknown[:10]
            }
        )
    return body


class KeyLimitListView(ApiView):
    required_permissions = {"GET": VIEW}

    @extend_schema(
        operation_id="keys_list",
        summary="Every flow key limit row, by name",
        responses={200: KeyLimitSerializer(many=True), **error_responses(401, 403)},
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        return Response([key_limit_json(row) for row in KeyLimit.objects.order_by("name")])


class KeyLimitDetailView(ApiView):
    required_permissions = {"GET": VIEW, "PATCH": CHANGE, "DELETE": CHANGE}

    @extend_schema(
        operation_id="keys_retrieve",
        summary="One flow key limit row",
        description="For one key (a name with ':'), also how many of its jobs run now.",
        parameters=[KEY_NAME],
        responses={200: KeyLimitDetailSerializer, **error_responses(400, 401, 403, 404)},
        tags=TAGS,
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(key_limit_detail_json(_row_or_404(_name(name))))

    @extend_schema(
        operation_id="keys_partial_update",
        summary="Set or change the limits of a key family or of one key",
        description=(
            "Creates the row when there is none. A field left out keeps its value; null "
            "clears it (weight: back to 1). Claims obey the change within a second. "
            "Recorded in the operators' audit log (set_key_limits)."
        ),
        parameters=[KEY_NAME],
        request=KeyLimitsChangeSerializer,
        responses={200: KeyLimitDetailSerializer, **error_responses(400, 401, 403)},
        tags=TAGS,
    )
    def patch(self, request: Request, name: str) -> Response:
        name = _name(name)
        changes = _changes(self.body(request))
        try:
            row = operator_actions.set_key_limits(name, changes, user=request.user)
        except KeyLimitError as error:
            raise ValidationError(error.errors) from None
        return Response(key_limit_detail_json(row))

    @extend_schema(
        operation_id="keys_destroy",
        summary="Remove the limits of a key family or of one key",
        description=(
            "A key without its own row obeys its family's; a family without a row is not "
            "limited (until code declares it again). Recorded in the operators' audit log."
        ),
        parameters=[KEY_NAME],
        responses={204: None, **error_responses(400, 401, 403, 404)},
        tags=TAGS,
    )
    def delete(self, request: Request, name: str) -> Response:
        name = _name(name)
        if not operator_actions.delete_key_limits(name, user=request.user):
            raise NotFound(f"No limits are set for {name!r}.")
        return Response(status=status.HTTP_204_NO_CONTENT)
