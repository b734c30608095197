"""JSON shapes of the workflow routes (``/workflows``, ``/jobs/<id>/dependencies``).

Input is checked by ``jobs.workflow_specs`` (errors by field such as
``steps.1.depends_on``); the request serializers here describe the body for
the schema only.
"""

from __future__ import annotations

from rest_framework import serializers

from django_controlplane.api.serializers import StateCountsSerializer
from django_controlplane.api.workflow_reads import MAX_DEPENDS_SHOWN, MAX_STEPS_SHOWN
from jobs.models import OnFailure, Workflow, WorkflowStatus


class WorkflowSerializer(serializers.ModelSerializer):
    schedule = serializers.UUIDField(
        source="schedule_id",
        read_only=True,
        allow_null=True,
        help_text="The schedule that fired it, or null.",
    )
    result = serializers.JSONField(
        read_only=True,
        allow_null=True,
        help_text="Once succeeded: its final step's result, or {step: result} for several "
        "final steps (null past 100 of them).",
    )

    class Meta:
        model = Workflow
        fields = [
            "id",
            "name",
            "status",
            "on_failure",
            "result",
            "created_at",
            "finished_at",
            "schedule",
        ]
        read_only_fields = fields


class WorkflowStepSerializer(serializers.Serializer):
    id = serializers.UUIDField(help_text="The step's job (GET /jobs/<id>).")
    step = serializers.CharField()
    operation = serializers.CharField()
    status = serializers.CharField()
    waiting_for = serializers.IntegerField(help_text="Dependencies not met yet.")
    depends_on = serializers.ListField(
        child=serializers.CharField(),
        help_text="The steps it waits for by name (a job id for a job outside the workflow), "
        f"at most {MAX_DEPENDS_SHOWN}.",
    )
    depends_on_count = serializers.IntegerField(help_text="All of its dependencies.")


class WorkflowDetailSerializer(WorkflowSerializer):
    counts = StateCountsSerializer(read_only=True, help_text="Its steps by status.")
    steps = WorkflowStepSerializer(
        many=True,
        read_only=True,
        help_text=f"Its first {MAX_STEPS_SHOWN} steps in the order they were added.",
    )
    steps_truncated = serializers.BooleanField(
        read_only=True, help_text="True when it has more steps than 'steps' lists."
    )
    jobs = serializers.URLField(
        read_only=True, help_text="All of its steps as jobs: GET /jobs?workflow=<id>."
    )

    class Meta(WorkflowSerializer.Meta):
        fields = [*WorkflowSerializer.Meta.fields, "counts", "steps", "steps_truncated", "jobs"]
        read_only_fields = fields


class WorkflowPageSerializer(serializers.Serializer):
    results = WorkflowSerializer(many=True)
    next = serializers.URLField(allow_null=True)


class WorkflowStepSpecSerializer(serializers.Serializer):
    name = serializers.CharField(required=False)
    operation = serializers.CharField()
    payload = serializers.JSONField(required=False)
    depends_on = serializers.JSONField(
        required=False,
        help_text='Step names, job ids, or {"step": name or id, "on_failure": policy}.',
    )
    on_failure = serializers.ChoiceField(choices=OnFailure.values, required=False)
    queue = serializers.CharField(required=False)
    priority = serializers.IntegerField(required=False)
    max_attempts = serializers.IntegerField(required=False)
    timeout_seconds = serializers.FloatField(required=False)
    keys = serializers.JSONField(required=False)


class WorkflowSpecSerializer(serializers.Serializer):
    """``POST /workflows``: the shape of ``jobs.workflow_specs``."""

    name = serializers.CharField(required=False, allow_blank=True)
    on_failure = serializers.ChoiceField(
        choices=OnFailure.values, required=False, help_text="Every edge's default policy."
    )
    steps = WorkflowStepSpecSerializer(many=True)


class DependencySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    step = serializers.CharField()
    operation = serializers.CharField()
    status = serializers.CharField()
    on_failure = serializers.ChoiceField(choices=OnFailure.values)
    met = serializers.BooleanField()
    result = serializers.JSONField(
        required=False, help_text="Present on succeeded dependencies (unless results_omitted)."
    )


class DependencyPageSerializer(serializers.Serializer):
    results = DependencySerializer(many=True)
    truncated = serializers.BooleanField(help_text="More dependencies than listed (10,000).")
    results_omitted = serializers.CharField(
        allow_null=True,
        help_text="Why no result is included: together they pass MAX_DEPENDENCY_RESULTS_BYTES.",
    )


WORKFLOW_STATES = list(WorkflowStatus.values)
