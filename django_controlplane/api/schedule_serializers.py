"""JSON shapes of the schedule routes (docs/schedules.md).

The input serializers check types and refuse unknown fields; the rules
(operation xor workflow, operation exists, payload schema, the workflow's
steps, cron xor every_seconds, time zone, …) are
``jobs.schedules.definitions.check_definition``'s.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from django_controlplane.api.serializers import StrictSerializer
from jobs.models import CatchUp, Overlap, Schedule, Workflow, WorkflowStatus
from jobs.schedules.firing import OUTCOMES
from jobs.schedules.selectors import FireRow, last_outcome
from jobs.selectors import STATES

SOURCES = ["api", "code"]


class FireSerializer(serializers.Serializer):
    """One fired slot of the schedule's history."""

    fire_at = serializers.DateTimeField(help_text="The slot (for run_now: when it was asked).")
    fired_at = serializers.DateTimeField()
    outcome = serializers.ChoiceField(choices=list(OUTCOMES))
    job = serializers.UUIDField(allow_null=True)
    job_status = serializers.ChoiceField(
        choices=list(STATES), allow_null=True, help_text="Null once the job is gone."
    )
    workflow = serializers.UUIDField(
        allow_null=True, help_text="A workflow schedule's fire: the workflow it started."
    )
    workflow_status = serializers.ChoiceField(choices=WorkflowStatus.values, allow_null=True)


class ScheduleSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    operation = serializers.CharField(allow_null=True, help_text="Null for a workflow schedule.")
    workflow = serializers.JSONField(
        allow_null=True,
        help_text="What a workflow schedule starts at each fire (the JSON of POST "
        "/workflows); null for a schedule of an operation.",
    )
    payload = serializers.JSONField()
    queue = serializers.CharField(allow_null=True, help_text="Null: the operation's queue.")
    priority = serializers.IntegerField()
    cron = serializers.CharField(allow_null=True, help_text="Null when every_seconds is set.")
    every_seconds = serializers.FloatField(allow_null=True)
    timezone = serializers.CharField(help_text="IANA name; cron fields are read in it.")
    catch_up = serializers.ChoiceField(choices=CatchUp.values)
    overlap = serializers.ChoiceField(choices=Overlap.values)
    paused = serializers.BooleanField()
    source = serializers.ChoiceField(
        choices=SOURCES, help_text="'code': declared in code; change it there."
    )
    next_fire_at = serializers.DateTimeField(allow_null=True)
    last_fire_at = serializers.DateTimeField(allow_null=True)
    last_outcome = serializers.CharField(
        allow_null=True,
        help_text="The newest fire's job status, or its outcome when it made no job "
        "(skipped_overlap, enqueue_failed); null before the first fire.",
    )
    last_job = serializers.UUIDField(allow_null=True)
    last_workflow = serializers.UUIDField(
        allow_null=True, help_text="The workflow the newest fire started (workflow schedules)."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ScheduleDetailSerializer(ScheduleSerializer):
    history = FireSerializer(many=True, help_text="The newest fires first.")


class SchedulePageSerializer(serializers.Serializer):
    results = ScheduleSerializer(many=True)


def schedule_json(schedule: Schedule, history: list[FireRow] | None = None) -> dict[str, Any]:
    """A schedule (annotated by ``jobs.schedules.selectors``) as the API shows it."""
    data = {
        "id": schedule.pk,
        "name": schedule.name,
        "operation": schedule.operation or None,
        "workflow": schedule.workflow,
        "payload": schedule.payload,
        "queue": schedule.queue,
        "priority": schedule.priority,
        "cron": schedule.cron or None,
        "every_seconds": schedule.every_seconds,
        "timezone": schedule.timezone,
        "catch_up": schedule.catch_up,
        "overlap": schedule.overlap,
        "paused": schedule.paused,
        "source": schedule.source,
        "next_fire_at": schedule.next_fire_at,
        "last_fire_at": schedule.last_fire_at,
        "last_outcome": last_outcome(schedule),
        "last_job": getattr(schedule, "last_job", None),
        "last_workflow": getattr(schedule, "last_workflow", None),
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
    }
    if history is None:
        return ScheduleSerializer(data).data
    data["history"] = [row.__dict__ for row in history]
    return ScheduleDetailSerializer(data).data


class NumberField(serializers.FloatField):
    """A JSON number only: DRF's ``FloatField`` would take ``true`` as 1 and ``"3600"``
    as 3600, and raise ``OverflowError`` (a 500) on an integer of hundreds of digits."""

    default_error_messages = {
        **serializers.FloatField.default_error_messages,
        "number": "Give a JSON number, not a string or a boolean.",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("number")
        try:
            return super().to_internal_value(data)
        except OverflowError:
            self.fail("invalid")
            raise  # unreachable: fail() raises


class _ScheduleFields(StrictSerializer):
    workflow = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="Instead of operation: the workflow each fire starts, as POST /workflows "
        "takes it ({name?, on_failure?, steps: [...]}); errors name workflow.steps.N.field. "
        "A workflow schedule has no payload, queue or priority of its own.",
    )
    payload = serializers.JSONField(
        required=False, help_text="A JSON object checked against the operation's schema."
    )
    cron = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=200,
        help_text="5 fields, or 6 with seconds first ('*/10 * * * * *'). Exclusive with "
        "every_seconds.",
    )
    every_seconds = NumberField(
        required=False, allow_null=True, help_text="1 to 31622400; aligned to the Unix epoch."
    )
    queue = serializers.CharField(
        required=False, allow_null=True, max_length=200, help_text="Default: the operation's."
    )
    priority = serializers.IntegerField(required=False, help_text="-100 to 100, larger first.")
    timezone = serializers.CharField(
        required=False, max_length=64, help_text="IANA name (default UTC)."
    )
    catch_up = serializers.ChoiceField(
        choices=CatchUp.values,
        required=False,
        help_text="Missed slots while no reaper ran: none, one (default), all (bounded).",
    )
    overlap = serializers.ChoiceField(
        choices=Overlap.values,
        required=False,
        help_text="skip: no fire while the previous run is queued or running.",
    )


class ScheduleCreateSerializer(_ScheduleFields):
    name = serializers.CharField(
        required=False, max_length=200, help_text="Unique; default '<operation>-<8 hex>'."
    )
    operation = serializers.CharField(
        required=False, max_length=200, help_text="Exactly one of operation and workflow."
    )
    paused = serializers.BooleanField(required=False, help_text="Create it paused.")


class ScheduleUpdateSerializer(_ScheduleFields):
    """The fields PATCH may change: a new timing fires from the first slot after now."""


class StartedWorkflowSerializer(serializers.Serializer):
    """The workflow a workflow schedule's run now started (GET /workflows/<id> has the rest)."""

    id = serializers.UUIDField()
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=WorkflowStatus.values)
    schedule = serializers.UUIDField(allow_null=True)
    created_at = serializers.DateTimeField()


def started_workflow_json(run: Workflow) -> dict[str, Any]:
    return StartedWorkflowSerializer(
        {
            "id": run.pk,
            "name": run.name,
            "status": run.status,
            "schedule": run.schedule_id,
            "created_at": run.created_at,
        }
    ).data
