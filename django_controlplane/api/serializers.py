"""JSON shapes of the REST API (README, "REST API"), for reading, writing and the schema.

Output serializers read model rows or the selectors' values; input
serializers only check types: the rules themselves (known operation, payload
schema, priority range, sizes) live in ``jobs.enqueue`` and come back as
``EnqueueError`` field errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC as datetime_utc
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Case, F, Func, TextField, Value, When
from django.db.models.functions import Cast
from django.utils import timezone
from rest_framework import ISO_8601, serializers
from rest_framework.fields import SkipField
from rest_framework.relations import PKOnlyObject
from rest_framework.settings import api_settings

from jobs.dependencies import MAX_DEPENDENCIES
from jobs.flow_keys import MAX_KEYS
from jobs.models import Job, JobEvent, OnFailure
from jobs.retry_policy import OVERRIDE_FIELDS, STRATEGIES
from jobs.selectors import STATES
from jobs.storable import MAX_DEPTH, first_unstorable
from jobs.uniqueness import MAX_KEY_LENGTH, UniqueWhile


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know, so a misspelt option is an error, not a no-op."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: ["This field is not known."] for name in unknown}
                )
        return super().to_internal_value(data)


class StateCountsSerializer(serializers.Serializer):
    """A count per job state; every state is present, zeros included."""

    queued = serializers.IntegerField()
    running = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()


assert tuple(StateCountsSerializer().fields) == STATES


# --- jobs ------------------------------------------------------------------------


class FlowKeysField(serializers.ListField):
    """A job's flow keys (``Job.flow_keys``): ``[]`` for a job without any, never null.

    It reads the whole row (``source="*"``) because the column holds null for
    an unkeyed job; ``JobSerializer.sql_sources`` spells the same in SQL.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(child=serializers.CharField(), source="*", read_only=True, **kwargs)

    def to_representation(self, job: Any) -> list[str]:
        return list(job.flow_keys or [])


class EmptyListWhenNull(Func):
    """``COALESCE(column, '[]'::jsonb)``: a JSON column's null read as an empty list."""

    template = "COALESCE(%(expressions)s, '[]'::jsonb)"
    output_field = models.JSONField()


class JobSerializer(serializers.ModelSerializer):
    """Job JSON as the README lists it, plus ``expires_at``, the unique key and the timeout."""

    parent = serializers.UUIDField(source="parent_id", read_only=True, allow_null=True)
    idempotency_key = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The unique_key when unique_while is until_retention (its older name).",
    )
    worker = serializers.UUIDField(source="worker_id", read_only=True, allow_null=True)
    payload = serializers.JSONField(read_only=True)
    result = serializers.JSONField(read_only=True, allow_null=True)
    schedule = serializers.UUIDField(
        source="schedule_id",
        read_only=True,
        allow_null=True,
        help_text="The schedule that fired it (GET /schedules/<id>), or null.",
    )
    retry_policy = serializers.JSONField(
        read_only=True,
        allow_null=True,
        help_text="The job's own retry override given at enqueue (over its operation's), or null.",
    )
    keys = FlowKeysField(
        help_text="The job's flow keys (its operation's, then the enqueue's), or [] for none."
    )
    priority_aged = serializers.IntegerField(
        read_only=True,
        help_text="How much priority aging (PRIORITY_AGING_SECONDS) added to 'priority' while "
        "the job waited; 0 when none.",
    )
    workflow = serializers.UUIDField(
        source="workflow_id",
        read_only=True,
        allow_null=True,
        help_text="The workflow it is a step of (GET /workflows/<id>), or null.",
    )
    step = serializers.CharField(
        read_only=True, help_text="Its step's name in its workflow, or '' outside one."
    )
    waiting_for = serializers.IntegerField(
        read_only=True,
        help_text="How many of its dependencies are not met yet (GET /jobs/<id>/dependencies); "
        "run_after is null while this is above 0.",
    )

    # The model's properties among the fields, and fields that read the whole row, as SQL
    # (``sql_document``).
    sql_sources = {
        "idempotency_key": Case(
            When(unique_while=UniqueWhile.UNTIL_RETENTION.value, then=F("unique_key")),
            default=None,
        ),
        "keys": EmptyListWhenNull(F("flow_keys")),
    }

    class Meta:
        model = Job
        fields = [
            "id",
            "operation",
            "queue",
            "status",
            "priority",
            "payload",
            "result",
            "error_code",
            "error_message",
            "attempts",
            "max_attempts",
            "parent",
            "progress_current",
            "progress_total",
            "created_at",
            "run_after",
            "started_at",
            "finished_at",
            "leased_until",
            "worker",
            "expires_at",
            "idempotency_key",
            "unique_key",
            "unique_while",
            "timeout_seconds",
            "schedule",
            "retry_policy",
            "retry_laters",
            "keys",
            "priority_aged",
            "workflow",
            "step",
            "waiting_for",
        ]
        read_only_fields = fields


class EnqueuedJobSerializer(JobSerializer):
    """``POST /jobs``: the job, and whether it is an earlier job that holds the unique key."""

    duplicate = serializers.BooleanField(
        read_only=True, help_text="True (status 200) when another job held the unique_key."
    )

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "duplicate"]
        read_only_fields = fields


class SecondsField(serializers.FloatField):
    """A number of seconds; true and false are not numbers here."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class JobDetailSerializer(JobSerializer):
    """One job, with its direct children counted by state."""

    children = StateCountsSerializer(source="children_counts", read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "children"]
        read_only_fields = fields


class JobPageSerializer(serializers.Serializer):
    results = JobSerializer(many=True)
    next = serializers.URLField(
        allow_null=True, help_text="The next page, or null on the last one."
    )
    count = serializers.IntegerField(
        allow_null=True,
        help_text="Matching jobs, counted up to COUNT_CAP. Null on pages reached by a cursor "
        "(unless count=true) and when the count ran out of time (count_capped true). A count "
        "of 1,000 or more (or one out of time) may be up to 2 seconds older than the page: "
        "each server process reuses it for the same filters that long.",
    )
    count_capped = serializers.BooleanField(
        help_text="True when more jobs match than 'count' says."
    )
    count_estimate = serializers.IntegerField(
        allow_null=True, help_text="The planner's estimate when capped (PostgreSQL), else null."
    )


class EnqueueSerializer(StrictSerializer):
    operation = serializers.CharField(max_length=200)
    payload = serializers.JSONField(
        required=False,
        help_text="A JSON object checked against the operation's schema; at most "
        f"{MAX_DEPTH} levels of nested objects and arrays, with no NUL character or "
        "lone surrogate in any string.",
    )
    queue = serializers.CharField(required=False, allow_null=True, max_length=200)
    priority = serializers.IntegerField(
        required=False, default=0, help_text="-100 to 100, larger first."
    )
    run_after = serializers.DateTimeField(required=False, allow_null=True)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    max_attempts = serializers.IntegerField(required=False, allow_null=True)
    parent = serializers.UUIDField(required=False, allow_null=True)
    idempotency_key = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=MAX_KEY_LENGTH,
        help_text="The same as unique_key with unique_while until_retention.",
    )
    unique_key = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=MAX_KEY_LENGTH,
        help_text="While another job holds this key, that job is returned (200) instead.",
    )
    unique_while = serializers.ChoiceField(
        choices=UniqueWhile.values,
        required=False,
        allow_null=True,
        help_text="How long a job holds its unique_key: queued (until it first starts), "
        "active (while queued or running; the default) or until_retention.",
    )
    timeout_seconds = SecondsField(
        required=False,
        allow_null=True,
        help_text="Longest run in seconds, above 0 and at most 30 days (default: the operation's).",
    )
    retry = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="This job's retry policy over its operation's: an object with any of "
        f"{', '.join(OVERRIDE_FIELDS)} (strategy: {', '.join(STRATEGIES)}; jitter a fraction "
        "from 0 to 1). Which exceptions retry is the operation's, in code.",
    )
    keys = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text=f"Flow keys added to the operation's own: a list of at most {MAX_KEYS} "
        'strings such as ["account:42", "api:7"], or templates filled from the payload '
        '("account:{account_id}"). Keys limit how many of their jobs run at once and how '
        "fast they start (GET /keys), and take turns in their queue.",
    )
    depends_on = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        allow_null=True,
        max_length=MAX_DEPENDENCIES,
        help_text="Ids of jobs this one waits for: it is claimable once they have all "
        "succeeded (run_after null until then). No run_after or unique_key with it.",
    )
    on_failure = serializers.ChoiceField(
        choices=OnFailure.values,
        required=False,
        allow_null=True,
        help_text="What a dependency's failure or cancellation does to this job: cancel it "
        "(the default, with the reason in its timeline), run it anyway, or hold it for an "
        "operator.",
    )

    def validate_keys(self, value: Any) -> Any:
        """Only the shape is checked here (the rules are in ``jobs.flow_keys``): a JSON list,
        not an object read as its names; thousands of wrong items are one message."""
        if value is not None and not isinstance(value, list):
            raise serializers.ValidationError(
                'keys must be a list of keys, such as ["account:42"].'
            )
        if value is not None and len(value) > MAX_KEYS:
            raise serializers.ValidationError(
                f"keys may list at most {MAX_KEYS} keys (it lists {len(value)})."
            )
        return value

    def validate_payload(self, value: Any) -> Any:
        """Refuse what no database stores, and nesting past ``MAX_DEPTH`` (the walk is a loop:
        a payload a thousand levels deep is a 400 here, not a ``RecursionError``)."""
        found = first_unstorable(value, "payload")
        if found is not None:
            raise serializers.ValidationError(f"The value at {found[0]} {found[1]}.")
        return value


class ReasonSerializer(StrictSerializer):
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        max_length=2000,
        help_text="Recorded on the job's event.",
    )


class BulkActionSerializer(StrictSerializer):
    """The filters of ``GET /jobs`` as a JSON body, plus ``ids``, ``reason`` and ``all``.

    Only the field names and rough types are declared here (for the schema and
    for unknown-field errors); ``jobs.selectors.job_filters_from_query`` reads them.
    """

    status = serializers.JSONField(required=False, help_text="A state or a list of states.")
    queue = serializers.JSONField(required=False, help_text="A queue or a list of queues.")
    operation = serializers.JSONField(required=False, help_text="An operation or a list.")
    parent = serializers.CharField(required=False, help_text="A job id, or 'none'.")
    created_after = serializers.CharField(required=False, help_text="ISO 8601.")
    created_before = serializers.CharField(required=False, help_text="ISO 8601.")
    q = serializers.CharField(required=False, allow_blank=True)
    schedule = serializers.CharField(required=False, help_text="A schedule id.")
    range = serializers.CharField(required=False, help_text="A window ending now: 15m … 7d.")
    when = serializers.CharField(required=False, help_text="scheduled or retrying.")
    payload = serializers.JSONField(required=False, help_text="A JSON object the payload contains.")
    ids = serializers.ListField(child=serializers.UUIDField(), required=False)
    reason = serializers.CharField(
        required=False, allow_blank=True, allow_null=True, max_length=2000
    )
    all = serializers.BooleanField(
        required=False, default=False, help_text="Required to act on every job (no filter)."
    )

    def get_fields(self) -> dict[str, serializers.Field]:
        # ``from`` and ``to`` (the short spellings of created_after/created_before) are
        # Python keywords: they cannot be declared as class attributes.
        fields = super().get_fields()
        fields["from"] = serializers.CharField(required=False, help_text="As created_after.")
        fields["to"] = serializers.CharField(required=False, help_text="As created_before.")
        return fields


class BulkResultSerializer(serializers.Serializer):
    changed = serializers.IntegerField(help_text="Jobs whose state changed (cascades included).")


# --- events ----------------------------------------------------------------------


class EventSerializer(serializers.ModelSerializer):
    """One timeline entry. (Its JSON ``fields`` column is mapped by the ModelSerializer:
    a declared attribute could not be called ``fields``.)"""

    class Meta:
        model = JobEvent
        fields = ["seq", "ts", "event", "level", "message", "fields"]
        read_only_fields = fields


class EventPageSerializer(serializers.Serializer):
    results = EventSerializer(many=True)
    last_seq = serializers.IntegerField(
        help_text="Pass it as 'after' on the next poll: the largest seq returned, or else "
        "the smaller of 'after' and the job's last seq (never past the real end)."
    )
    has_more = serializers.BooleanField(
        help_text="True when the page was full: poll again at once."
    )


# --- queues and workers ------------------------------------------------------------


class ThroughputSerializer(serializers.Serializer):
    last_minute = serializers.IntegerField(help_text="Jobs that finished in the last minute.")
    last_hour = serializers.IntegerField(help_text="Jobs that finished in the last hour.")


class QueueSerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["job", "batch"])
    counts = StateCountsSerializer()
    oldest_queued_age = serializers.FloatField(
        allow_null=True, help_text="Seconds since the oldest queued job was created."
    )
    running = serializers.IntegerField()
    throughput = ThroughputSerializer()
    paused = serializers.BooleanField()
    concurrency_cap = serializers.IntegerField(allow_null=True)
    rate_limit_per_second = serializers.FloatField(
        allow_null=True, help_text="Most jobs started per second across all workers."
    )
    pending_messages = serializers.IntegerField(help_text="Batch messages waiting on the queue.")


class QueueLimitsSerializer(serializers.Serializer):
    """``PATCH /queues/<name>`` (schema only; the rules are ``jobs.queue_limits``)."""

    concurrency_cap = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="Null clears it."
    )
    rate_limit_per_second = serializers.FloatField(
        required=False, allow_null=True, help_text="Jobs started per second; null clears it."
    )


class WorkerSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["local", "remote"])
    hostname = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    queues = serializers.ListField(child=serializers.CharField())
    operations = serializers.ListField(child=serializers.CharField())
    concurrency = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    last_heartbeat = serializers.DateTimeField()
    heartbeat_age = serializers.FloatField(help_text="Seconds since the last heartbeat.")
    current_jobs = serializers.ListField(
        child=serializers.UUIDField(), help_text="Ids of the jobs it is running."
    )
    holding_until = serializers.DateTimeField(
        allow_null=True,
        help_text="Its pre_dequeue hook said 'not now': it claims nothing until then (or null).",
    )
    holding_reason = serializers.CharField(
        allow_blank=True, help_text="Why it is holding off, as its hook said (or empty)."
    )


class ErrorSerializer(serializers.Serializer):
    """The one error shape of every 4xx."""

    message = serializers.CharField()
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


# --- the remote-worker protocol (responses, for the schema) ----------------------
# ``django_controlplane.remote.views`` renders these as plain dicts; these serializers
# describe exactly those dicts so /schema (and schemathesis) can check them.


class RemoteWorkerSerializer(serializers.Serializer):
    """``POST /workers`` (201): the registered worker and what the client paces itself by."""

    id = serializers.UUIDField()
    name = serializers.CharField(allow_blank=True)
    kind = serializers.ChoiceField(choices=["local", "remote"])
    hostname = serializers.CharField(allow_blank=True)
    pid = serializers.IntegerField(allow_null=True)
    queues = serializers.ListField(child=serializers.CharField())
    operations = serializers.ListField(child=serializers.CharField())
    concurrency = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    last_heartbeat = serializers.DateTimeField()
    heartbeat_interval = serializers.FloatField(help_text="Seconds between heartbeats.")
    lease_seconds = serializers.FloatField(help_text="How long a claim holds a job.")
    worker_timeout = serializers.FloatField(help_text="Silence after which the worker is swept.")
    poll_interval = serializers.FloatField()
    max_wait = serializers.FloatField(help_text="The largest 'wait' a claim honours.")
    websocket = serializers.CharField(help_text="Path of the job.available WebSocket.")


class HeartbeatResultSerializer(RemoteWorkerSerializer):
    """``PATCH /workers/<id>``: the worker, and which held jobs it keeps, lost or must stop."""

    held = serializers.ListField(child=serializers.UUIDField())
    lost = serializers.ListField(child=serializers.UUIDField())
    cancelled = serializers.ListField(child=serializers.UUIDField())
    timed_out = serializers.ListField(
        child=serializers.UUIDField(),
        help_text="Held jobs past their timeout_seconds, failed with JobTimeout (also in lost).",
    )


class DisconnectResultSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    requeued = serializers.ListField(
        child=serializers.UUIDField(), help_text="Its running jobs, back in 'queued'."
    )


class ClaimedJobSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    operation = serializers.CharField()
    queue = serializers.CharField()
    payload = serializers.JSONField()
    attempt = serializers.IntegerField()
    attempts = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    parent = serializers.UUIDField(allow_null=True)
    status = serializers.ChoiceField(choices=["running"])
    lease_token = serializers.UUIDField(help_text="Send it with every call on this job.")
    timeout_seconds = serializers.FloatField(
        allow_null=True, help_text="Seconds the run may take; past them the job is failed."
    )
    trace_context = serializers.DictField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The enqueuer's trace context (W3C traceparent, tracestate): "
        "continue it as the parent of the run's span. Null when the enqueue was not traced.",
    )


class ClaimResultSerializer(serializers.Serializer):
    jobs = ClaimedJobSerializer(many=True)


class EventCreatedSerializer(serializers.Serializer):
    job = serializers.UUIDField()
    seq = serializers.IntegerField()


class OutcomeSerializer(serializers.Serializer):
    """``POST /jobs/<id>/complete`` and ``/fail``: the job's state after the call."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=list(STATES))


_SHARED: dict[type[serializers.Serializer], serializers.Serializer] = {}


def _shared(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    shared = _SHARED.get(serializer_class)
    if shared is None:  # two threads may both make one: either serves
        shared = _SHARED.setdefault(serializer_class, serializer_class())
    return shared


def represent(serializer_class: type[serializers.Serializer], instance: Any) -> dict[str, Any]:
    """``serializer_class(instance).data``, from one instance of the serializer per class.

    DRF builds a ModelSerializer's fields anew for every serializer instance
    (twenty ``build_field`` calls and deep copies for a job: about half a
    millisecond), the same fields every time. Representing is read-only, so
    one instance serves every request: what ``POST /jobs`` and the polled
    ``GET /jobs/<id>`` answer with. The fields are read as ``represent_many``
    reads them.
    """
    return represent_many(serializer_class, (instance,))[0]


def represent_many(
    serializer_class: type[serializers.Serializer], instances: Iterable[Any]
) -> list[dict[str, Any]]:
    """``[serializer_class(i).data for i in instances]``, without DRF's per-field dispatch.

    DRF represents a field through ``get_attribute`` (a ``Mapping`` check, a
    callable check, exception handling) and the field's ``to_representation``
    (for a datetime: ``getattr`` of its format, the current time zone, two
    time-zone checks), for every field of every row: 26 fields x 50 jobs made
    a page of ``GET /jobs`` cost 2.7 ms of CPU. Here each field's reading is
    worked out once per serializer class (``_plan``): a plain attribute read
    and the conversion DRF's field class would do (``str`` for text and
    UUIDs, ``int``, ``float``, the ISO 8601 text of a datetime in the current
    time zone). A field this does not know how to read (a nested serializer,
    a method, a subclass with its own ``to_representation``, a datetime
    format other than ISO 8601) is represented by DRF itself; so is any
    instance whose fast reading raises, which then gets DRF's own answer or
    error. ``tests/unit/test_represent_many.py`` holds the two equal.
    """
    shared = _shared(serializer_class)
    if serializer_class in _plans:
        plan = _plans[serializer_class]
    else:  # two threads may both make one: either serves
        plan = _plans.setdefault(serializer_class, _plan(shared))
    if plan is None:
        return [shared.to_representation(instance) for instance in instances]
    steps = _bind(plan)
    out = []
    for instance in instances:
        if isinstance(instance, Mapping):
            out.append(shared.to_representation(instance))
            continue
        try:
            out.append(_read(steps, instance))
        except Exception:
            # DRF's own path: its answer, or its error, for this instance.
            out.append(shared.to_representation(instance))
    return out


class _Slow(Exception):
    """A value the fast reading does not handle (DRF represents that instance)."""


# What a step of a plan does with the value it read.
_ATTRIBUTE, _DATETIME, _FIELD = "attribute", "datetime", "field"
Convert = Callable[[Any], Any]
Step = tuple[str, str, str, Any]  # (kind, field name, attribute or "", conversion or field)


def _text(value: Any) -> str:
    return value if type(value) is str else str(value)


def _same(value: Any) -> Any:
    return value


def _bool(field: serializers.BooleanField) -> Convert:
    def convert(value: Any) -> Any:
        return value if value is True or value is False else field.to_representation(value)

    return convert


def _choice(field: serializers.ChoiceField) -> Convert:
    known = field.choice_strings_to_values

    def convert(value: Any) -> Any:
        return known.get(value, value) if type(value) is str else field.to_representation(value)

    return convert


def _conversion(field: serializers.Field) -> Convert | None:
    """What the field's own ``to_representation`` does to a value that is not None, as a plain
    function; None when it is not one of these exact classes (DRF then represents it)."""
    kind = type(field)
    if kind is serializers.CharField:
        return _text
    if kind is serializers.UUIDField:
        return _text if field.uuid_format == "hex_verbose" else None
    if kind is serializers.IntegerField:
        return int
    if kind is serializers.FloatField:
        return float
    if kind is serializers.JSONField:
        return None if field.binary else _same
    if kind is serializers.BooleanField:
        return _bool(field)
    if kind is serializers.ChoiceField:
        return _choice(field)
    return None


def _plain_attribute(serializer: serializers.Serializer, field: serializers.Field) -> str | None:
    """The attribute the field reads, when reading it is a plain ``getattr``: one source
    attribute that is a column of the model, a property or a class attribute that is no
    method. None otherwise (DRF's ``get_attribute`` would call a method, follow a path...)."""
    sources = getattr(field, "source_attrs", None)
    if not sources or len(sources) != 1 or field.source == "*":
        return None
    attr = sources[0]
    model = getattr(getattr(serializer, "Meta", None), "model", None)
    if model is None:
        return None
    if attr in {f.attname for f in model._meta.concrete_fields}:
        return attr
    declared = getattr(model, attr, None)
    if isinstance(declared, property) or (declared is not None and not callable(declared)):
        return attr
    return None


def _plan(serializer: serializers.Serializer) -> list[Step] | None:
    """How to read each readable field of ``serializer``, worked out once per class; None
    when the serializer represents instances its own way (DRF then does it all)."""
    if type(serializer).to_representation is not serializers.Serializer.to_representation:
        return None
    steps: list[Step] = []
    for field in serializer._readable_fields:
        attr = _plain_attribute(serializer, field)
        if attr is None:
            steps.append((_FIELD, field.field_name, "", field))
        elif type(field) is serializers.DateTimeField:
            steps.append((_DATETIME, field.field_name, attr, field))
        elif (convert := _conversion(field)) is not None:
            steps.append((_ATTRIBUTE, field.field_name, attr, convert))
        else:
            steps.append((_FIELD, field.field_name, "", field))
    return steps


_plans: dict[type[serializers.Serializer], list[Step] | None] = {}


def _bind(plan: list[Step]) -> list[Step]:
    """The plan for this call: datetimes in the current time zone, read as DRF would read it
    now (the zone is activated per request; ``DATETIME_FORMAT`` may be overridden)."""
    zone = timezone.get_current_timezone() if settings.USE_TZ else None
    bound: list[Step] = []
    for kind, name, attr, how in plan:
        if kind == _DATETIME:
            fast = (
                zone is not None
                and not hasattr(how, "timezone")
                and str(getattr(how, "format", api_settings.DATETIME_FORMAT) or "").lower()
                == ISO_8601
            )
            if fast:
                bound.append((_ATTRIBUTE, name, attr, _iso_in(zone)))
            else:
                bound.append((_FIELD, name, "", how))
        else:
            bound.append((kind, name, attr, how))
    return bound


def _iso_in(zone: Any) -> Convert:
    def iso(value: Any) -> str:
        if type(value) is not datetime or value.tzinfo is None:
            raise _Slow
        text = value.astimezone(zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text

    return iso


def _read(steps: list[Step], instance: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, name, attr, how in steps:
        if kind == _ATTRIBUTE:
            value = getattr(instance, attr)
            out[name] = None if value is None else how(value)
            continue
        # DRF's own reading of one field (Serializer.to_representation's loop body).
        try:
            attribute = how.get_attribute(instance)
        except SkipField:
            continue
        check = attribute.pk if isinstance(attribute, PKOnlyObject) else attribute
        out[name] = None if check is None else how.to_representation(attribute)
    return out


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """What ``serializer_class(data=data)`` validates to, from the shared instance; raises
    ``ValidationError`` with the same details ``is_valid(raise_exception=True)`` would.

    Validating reads the fields and keeps nothing on them (the state
    ``is_valid`` stores lives on the instance, which this does not use), so
    one instance is safe for every thread.
    """
    return _shared(serializer_class).run_validation(data)


# --- the same JSON, written by PostgreSQL ---------------------------------------------


class JsonDocument(Func):
    """``json_build_object(key, value, ...)::text``: one JSON object, keys in this order."""

    function = "JSON_BUILD_OBJECT"
    template = "%(function)s(%(expressions)s)::text"
    output_field = TextField()


class IsoDatetimeUtc(Func):
    """A timestamp as DRF writes an aware datetime in UTC: ``isoformat()`` with ``Z``, the
    microseconds only when there are any (Python's ``isoformat``); NULL stays NULL."""

    template = (
        "to_char(%(expressions)s AT TIME ZONE 'UTC', CASE WHEN date_trunc('second', "
        '%(expressions)s) = %(expressions)s THEN \'YYYY-MM-DD"T"HH24:MI:SS"Z"\' '
        'ELSE \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\' END)'
    )
    output_field = TextField()


class PythonFloat(Func):
    """A float8 as JSON the way Python writes a float: a whole number keeps its ``.0``
    (PostgreSQL writes ``3``, which a client would read as an integer)."""

    template = (
        "(CASE WHEN %(expressions)s = trunc(%(expressions)s) AND abs(%(expressions)s) < 1e15 "
        "THEN trunc(%(expressions)s)::numeric::text || '.0' ELSE %(expressions)s::text END)::json"
    )
    output_field = models.JSONField()


def sql_document(serializer_class: type[serializers.Serializer]) -> Func | None:
    """What ``represent(serializer_class, job)`` answers, as one SQL expression over the
    model's row (PostgreSQL: ``json_build_object(...)::text``), or None when it cannot be.

    For ``GET /jobs``: fifty jobs read as model instances and represented in Python
    cost about 2 ms of the web process's CPU (psycopg's types, Django's
    converters, the instances, the fields, ``json.dumps``); PostgreSQL writes the
    same fifty objects in about 0.4 ms. Each field of the plan (``_plan``) maps to
    SQL that gives what DRF's field would: text and UUIDs as strings, numbers,
    JSON columns as they are, datetimes as ISO 8601 in UTC with ``Z``
    (``IsoDatetimeUtc``), floats with Python's ``.0`` (``PythonFloat``), and the
    model's properties through the serializer's ``sql_sources``. None (the page is
    then represented in Python) when any field has no such SQL, when the active
    time zone is not UTC, or when ``DATETIME_FORMAT`` is not ISO 8601.
    ``tests/integration/api/test_list_documents.py`` holds the two equal.

    The JSON is the same value, not always the same text: PostgreSQL puts a space
    after ``:`` and ``,``, and writes a JSON column's numbers as stored (``2.50``
    where Python writes ``2.5``).
    """
    if not settings.USE_TZ:
        return None
    zone = timezone.get_current_timezone()
    if getattr(zone, "key", None) != "UTC" and zone is not datetime_utc:
        return None
    fmt = api_settings.DATETIME_FORMAT  # may change under a test's settings: built anew then
    key = (serializer_class, fmt)
    if key not in _documents:
        _documents[key] = _document(serializer_class)
    return _documents[key]


_documents: dict[tuple[type[serializers.Serializer], Any], Func | None] = {}


def _document(serializer_class: type[serializers.Serializer]) -> Func | None:
    shared = _shared(serializer_class)
    if serializer_class in _plans:
        plan = _plans[serializer_class]
    else:
        plan = _plans.setdefault(serializer_class, _plan(shared))
    if plan is None:
        return None
    model = getattr(getattr(shared, "Meta", None), "model", None)
    if model is None:
        return None
    columns = {f.attname: f for f in model._meta.concrete_fields}
    sources: dict[str, Any] = getattr(serializer_class, "sql_sources", {})
    parts: list[Any] = []
    for kind, name, attr, how in plan:
        field = how if kind in (_FIELD, _DATETIME) else shared.fields[name]
        expression = _sql_value(kind, field, columns.get(attr), sources.get(attr or name))
        if expression is None:
            return None
        parts += [Value(name), expression]
    return JsonDocument(*parts)


def _sql_value(kind: str, field: serializers.Field, column: Any, source: Any) -> Any:
    """The SQL for one field of the plan, or None when there is none."""
    if source is not None:  # a property or a whole-row field, as the serializer spells it in SQL
        return source if type(field) is serializers.CharField or field.source == "*" else None
    if column is None:
        return None
    ref = F(column.attname)
    if column.is_relation:  # a foreign key's column holds the target's value
        column = column.target_field
    if kind == _DATETIME:
        fmt = getattr(field, "format", api_settings.DATETIME_FORMAT)
        if hasattr(field, "timezone") or str(fmt or "").lower() != ISO_8601:
            return None
        return IsoDatetimeUtc(ref) if isinstance(column, models.DateTimeField) else None
    if kind != _ATTRIBUTE:
        return None
    field_type = type(field)
    if field_type is serializers.UUIDField:
        uuid_column = isinstance(column, models.UUIDField)
        return (
            Cast(ref, TextField()) if uuid_column and field.uuid_format == "hex_verbose" else None
        )
    if field_type is serializers.CharField:
        return ref if isinstance(column, (models.CharField, models.TextField)) else None
    if field_type is serializers.ChoiceField:
        same = all(key == value for key, value in field.choice_strings_to_values.items())
        return ref if same and isinstance(column, models.CharField) else None
    if field_type is serializers.IntegerField:
        return ref if isinstance(column, models.IntegerField) else None
    if field_type is serializers.FloatField:
        return PythonFloat(ref) if isinstance(column, models.FloatField) else None
    if field_type is serializers.JSONField:
        return ref if isinstance(column, models.JSONField) and not field.binary else None
    return None
