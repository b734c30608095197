"""A job to enqueue, as its caller describes it (``JobSpec``), and its checks.

``prepare_row`` turns a spec into the row the enqueue statement inserts
(``jobs.enqueue_statement.Row``) or into errors by field, the same for
every way in (Python, the CLI, the REST API, the dashboard's form): the
operation must exist, the payload be a JSON object its schema accepts and
that both databases store alike, the priority, attempts, times, queue name,
unique key, timeout and retry override within their rules. A batch of specs shares one
``SpecBatch``, so what many specs repeat is checked once.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.utils import timezone

from jobs.enqueue_statement import Row
from jobs.exceptions import EnqueueError
from jobs.flow_keys import declared_keys, job_keys
from jobs.ids import new_job_ids
from jobs.models import PRIORITY_MAX, PRIORITY_MIN
from jobs.operations import operation_spec
from jobs.payload_json import encode_payload
from jobs.retry_policy import RetryPolicy, check_override
from jobs.storable import text_problem
from jobs.uniqueness import DEFAULT_UNIQUE_WHILE, MAX_KEY_LENGTH, UniqueWhile

# The longest per-job timeout: past it the reaper's global timeout is the better tool.
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600.0


@dataclass(slots=True)
class JobSpec:
    """One job to enqueue; ``None`` fields take the operation's defaults.

    Slotted: bulk callers build thousands (a third cheaper to make than with
    an instance dict, and quicker to read back in ``prepare_row``).

    ``unique_key`` with ``unique_while`` (``queued``, ``active``, the default,
    or ``until_retention``) keeps duplicates out (``jobs.uniqueness``);
    ``idempotency_key`` is the older name of a key held until retention.
    ``timeout_seconds`` bounds one run (default: the operation's).
    ``retry`` overrides the numbers of the operation's retry policy for this job
    (``jobs.retry_policy.OVERRIDE_FIELDS``: backoff, cap, jitter, strategy and the
    bound on running later); a ``RetryPolicy`` is taken for its numbers.
    """

    operation: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    run_after: datetime | None = None
    expires_at: datetime | None = None
    max_attempts: int | None = None
    parent: uuid.UUID | str | None = None
    idempotency_key: str | None = None
    unique_key: str | None = None
    unique_while: str | None = None
    timeout_seconds: float | None = None
    # The schedule firing it (jobs.schedules.firing); stored as ``Job.schedule``.
    schedule: uuid.UUID | str | None = None
    retry: dict[str, Any] | RetryPolicy | None = None
    # Flow keys added to the operation's own (jobs.flow_keys): keys or templates.
    keys: list[Any] | None = None
    # Jobs this one waits for (jobs.dependencies): ids, ``Job``s, ``After``s, or the
    # indexes of other specs of the same ``enqueue_many`` call; and what their
    # failure does to it (``cancel``, the default, ``run`` or ``hold``).
    depends_on: list[Any] | None = None
    on_failure: str | None = None


class SpecBatch:
    """Per-call memo of ``prepare_row``: work that is the same for many specs is done once.

    Bulk enqueue usually repeats one operation with one payload shape; its
    schema check and its JSON encodings are then paid once, not per row.
    """

    __slots__ = ("limit", "now", "ops", "checked", "texts", "ids")

    def __init__(self, limit: int, now: datetime, size: int = 1) -> None:
        self.limit = limit
        self.now = now
        self.ids = iter(new_job_ids(size))
        self.ops: dict[str, Any] = {}
        self.checked: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.texts: dict[str, str | None] = {}

    def op(self, name: str) -> Any:
        op = self.ops.get(name)
        if op is None:
            op = self.ops[name] = _resolve(name)
        return op

    def text_error(self, value: str) -> str | None:
        """Why a queue name or key cannot be stored (NUL, surrogate), memoised."""
        if value not in self.texts:
            self.texts[value] = text_problem(value)
        return self.texts[value]


def prepare_row(spec: JobSpec, batch: SpecBatch) -> tuple[Row | None, dict[str, list[str]]]:
    """The spec as a row ready to insert, or no row and its errors by field.

    Fills what the spec leaves to its operation (queue, max attempts,
    timeout), takes the next id of the batch and serialises the payload
    once, for the row to carry as it is stored.
    """
    op = batch.op(spec.operation)
    if isinstance(op, EnqueueError):
        return None, dict(op.errors)
    payload = spec.payload
    if type(payload) is not dict and not isinstance(payload, dict):
        return None, {"payload": ["The payload must be a JSON object."]}
    payload_json, errors = encode_payload(payload, batch.limit)
    if not errors:
        memo = (spec.operation, payload_json)
        schema_errors = batch.checked.get(memo)
        if schema_errors is None:
            schema_errors = batch.checked[memo] = op.validate(payload)
        if schema_errors:
            errors = dict(schema_errors)
    priority = spec.priority
    if not _whole(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        errors["priority"] = [
            f"Priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}."
        ]
    max_attempts = spec.max_attempts
    if max_attempts is not None and (not _whole(max_attempts) or not 1 <= max_attempts <= 1000):
        errors["max_attempts"] = ["max_attempts must be a whole number from 1 to 1000."]
    run_after, expires_at = spec.run_after, spec.expires_at
    if run_after is not None or expires_at is not None:
        for name, value in (("run_after", run_after), ("expires_at", expires_at)):
            if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
                errors[name] = [f"{name} must be a timezone-aware datetime."]
    queue = spec.queue
    if queue is not None:
        if not isinstance(queue, str) or not queue.strip():
            errors["queue"] = ["The queue name must be a non-empty string."]
        elif reason := batch.text_error(queue):
            errors["queue"] = [f"The queue name {reason}."]
    key, unique_while = spec.unique_key, spec.unique_while
    if key is not None or unique_while is not None or spec.idempotency_key is not None:
        key, unique_while = _unique(spec, errors)
    timeout = spec.timeout_seconds
    if timeout is None:
        timeout = getattr(op, "timeout_seconds", None)
    elif not _seconds(timeout):
        errors["timeout_seconds"] = [
            f"timeout_seconds must be a number above 0 and at most {MAX_TIMEOUT_SECONDS:g} "
            "(30 days)."
        ]
    parent_id = None
    if spec.parent:
        try:
            parent_id = (
                spec.parent if isinstance(spec.parent, uuid.UUID) else uuid.UUID(str(spec.parent))
            )
        except ValueError:
            errors["parent"] = [f"No job with id {spec.parent}."]
    schedule_id = None
    if spec.schedule is not None:
        try:
            schedule_id = uuid.UUID(str(spec.schedule))
        except ValueError:
            errors["schedule"] = [f"No schedule with id {spec.schedule}."]
    retry = spec.retry
    if retry is not None:
        if isinstance(retry, RetryPolicy):
            retry = retry.override_json()
        retry, retry_errors = check_override(retry)
        errors.update(retry_errors)
    keys: list[str] = []
    declared = declared_keys(op)
    if declared or spec.keys is not None:
        keys, key_errors = job_keys(
            declared,
            spec.keys,
            payload if not errors.get("payload") else {},
            queue=queue or op.queue,
            operation=spec.operation,
        )
        if key_errors and "payload" not in errors:
            errors["keys"] = key_errors
    if errors:
        return None, errors
    return Row(
        next(batch.ids),
        spec.operation,
        queue or op.queue,
        payload,
        payload_json,
        priority,
        run_after or batch.now,
        expires_at,
        max_attempts or op.max_attempts,
        parent_id,
        key,
        unique_while,
        float(timeout) if timeout is not None else None,
        schedule_id,
        retry_policy=retry,
        flow_keys=keys or None,
        fair_key=keys[0] if keys else None,
    ), {}


def again(row: Row, batch: SpecBatch) -> Row:
    """``row`` once more under the batch's next id: a spec repeated in one call is checked once.

    Every field is copied (``dataclasses.replace``), so a field added to ``Row``
    cannot be lost on the repeats. For rows without a retry override or flow keys:
    keyed rows take fair turns of their own.
    """
    return replace(row, id=next(batch.ids), repeats=row.repeats or row)


def _seconds(value: Any) -> bool:
    """A finite number of seconds above 0 and within ``MAX_TIMEOUT_SECONDS`` (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= MAX_TIMEOUT_SECONDS
    )


def _unique(spec: JobSpec, errors: dict[str, list[str]]) -> tuple[str | None, str | None]:
    """The spec's key and mode, ``idempotency_key`` read as ``until_retention``; errors added."""
    key, mode, name = spec.unique_key, spec.unique_while, "unique_key"
    if spec.idempotency_key is not None:
        if key is not None:
            errors["idempotency_key"] = [
                "Give unique_key or idempotency_key, not both: an idempotency key is a "
                "unique_key held until retention."
            ]
            return None, None
        if mode not in (None, UniqueWhile.UNTIL_RETENTION):
            errors["unique_while"] = [
                "An idempotency key is held until retention; use unique_key for "
                f"unique_while {mode!r}."
            ]
            return None, None
        key, mode, name = spec.idempotency_key, UniqueWhile.UNTIL_RETENTION.value, "idempotency_key"
    label = name.replace("_", " ")
    if key is None:
        errors["unique_while"] = ["unique_while needs a unique_key."]
    elif not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH:
        errors[name] = [f"The {label} must be 1 to {MAX_KEY_LENGTH} characters."]
    elif reason := text_problem(key):
        errors[name] = [f"The {label} {reason}."]
    if mode is None:
        mode = DEFAULT_UNIQUE_WHILE.value
    elif mode not in UniqueWhile.values:
        errors["unique_while"] = [
            f"unique_while must be one of {', '.join(UniqueWhile.values)}, not {mode!r}."
        ]
    return key, str(mode)


def _whole(value: Any) -> bool:
    """An int but not a bool (the exact-type test first: it is the common case)."""
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _resolve(name: str) -> Any:
    try:
        return operation_spec(name)
    except EnqueueError as error:
        return error
