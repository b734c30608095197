"""Operations: named units of work, their registry, and what they receive.

An operation declares its payload schema (JSON Schema, validated at enqueue),
its default queue and attempt budget. Workers resolve it by name at claim
time and call ``execute(ctx, payload)``.

Define one with a class::

    @registry.register
    class Resize(Operation):
        name = "resize"
        queue = "images"
        payload_schema = {"type": "object", "required": ["url"],
                          "properties": {"url": {"type": "string"}}}

        def execute(self, ctx, payload):
            ctx.emit("resize.downloaded", bytes=123)
            return {"ok": True}

or with a function: ``@operation("resize", queue="images")``.

How failures are retried is the operation's ``retry`` (a ``RetryPolicy``:
backoff, strategy, jitter, the exceptions that retry and those that fail at
once, the bound on ``RetryLaterError``); ``retryable_exceptions`` still adds
to its ``retry_on``. A job may override the numbers at enqueue.
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from jobs.events import JOB_PROGRESS
from jobs.exceptions import ControlPlaneError, JobCancelled, RetryLaterError, UnknownOperation
from jobs.flow_keys import Key, check_declared
from jobs.retry_policy import RetryPolicy
from jobs.schema_precheck import known_valid
from jobs.storable import MAX_DEPTH, checked_progress, depth_problem, first_unstorable, too_deep

if TYPE_CHECKING:
    from jobs.claims import ClaimedJob
    from jobs.outcomes import JobError, JobOutcome

__all__ = [
    "InvalidPayloadSchema",
    "JobContext",
    "Operation",
    "OperationRegistry",
    "OperationResult",
    "RetryLaterError",
    "RetryPolicy",
    "operation",
    "registry",
    "schema_problem",
]


@dataclass(frozen=True)
class OperationResult:
    """What an operation may return instead of a plain result.

    ``deferred=True`` keeps the job ``running`` after the operation returns:
    a coordinator whose batches close it later.

    ``progress_current``/``progress_total`` are whole numbers from 0 to
    ``jobs.storable.PROGRESS_MAX`` (a current above the total is lowered to
    it); anything else fails the job with ``InvalidProgress``. ``result``
    must be JSON (plus the conversions ``jobs.storable.storable_json``
    documents) of at most ``MAX_RESULT_BYTES``: ``ResultNotSerializable`` or
    ``ResultTooLarge`` otherwise.
    """

    result: Any = None
    deferred: bool = False
    progress_current: int | None = None
    progress_total: int | None = None


class JobContext:
    """What a running operation gets besides its payload.

    ``emit`` writes to the job's timeline at once (readers see it while the
    operation still runs); once the job is cancelled, ``emit`` raises
    ``JobCancelled`` and ``cancelled`` turns true.
    """

    def __init__(
        self,
        job: ClaimedJob,
        *,
        emitter: Callable[..., int],
        cancel_event: threading.Event | None = None,
    ) -> None:
        self.job = job
        self._emitter = emitter
        self._cancel_event = cancel_event or threading.Event()

    @property
    def job_id(self):
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def cancelled(self) -> bool:
        return self._cancel_event.is_set()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise JobCancelled(self.job.id)

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on cancellation. True if cancelled."""
        return self._cancel_event.wait(timeout)

    def emit(
        self, event: str, message: str | None = None, level: str = "info", **fields: Any
    ) -> int:
        self.raise_if_cancelled()
        try:
            return self._emitter(event=event, message=message, level=level, fields=fields)
        except JobCancelled:
            self._cancel_event.set()
            raise

    def dependency_results(self) -> dict[str, Any]:
        """The results of the jobs this one waited for (``depends_on``), by step name or job id."""
        from jobs.dependencies import dependency_results

        return dependency_results(self.job.id)

    def progress(self, current: int, total: int | None = None, message: str | None = None) -> int:
        """Record progress: whole numbers from 0 to ``PROGRESS_MAX``, else ``InvalidProgress``
        (raised here, before any write); a ``current`` above ``total`` is stored as ``total``."""
        checked_progress(current, total)
        fields: dict[str, Any] = {"_progress_current": current}
        if total is not None:
            fields["_progress_total"] = total
        return self.emit(JOB_PROGRESS, message, **fields)


class Operation:
    """Base class for operations. Subclasses set ``name`` and implement ``execute``."""

    name: ClassVar[str] = ""
    queue: ClassVar[str] = "default"
    max_attempts: ClassVar[int] = 1
    payload_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    # Run inside one transaction that commits with the success transition:
    # the operation's own writes land together with ``succeeded`` or not at all.
    atomic: ClassVar[bool] = False
    # Exceptions worth another attempt (with backoff) while attempts remain.
    retryable_exceptions: ClassVar[tuple[type[BaseException], ...]] = ()
    # How failures are retried (jobs.retry_policy); None: the knobs' policy.
    retry: ClassVar[RetryPolicy | None] = None
    # Seconds a run may take before the worker fails it with ``JobTimeout``
    # (``job.timeout``) and tells it to stop; each job may set its own at
    # enqueue. None: only the reaper's global ``REAPER_TIMEOUT_SECONDS``.
    timeout_seconds: ClassVar[float | None] = None
    description: ClassVar[str] = ""
    # A periodic schedule declared with the operation (jobs.schedules.declared): a cron
    # expression, or a dict with cron | every_seconds, timezone, payload, catch_up, overlap.
    schedule: ClassVar[str | dict[str, Any] | None] = None
    # Flow keys (jobs.flow_keys): ``Key`` objects or templates filled from each payload,
    # such as ``Key("account:{account_id}", concurrency=2)``.
    # (Not a ClassVar: registering checks them into ``Key`` objects on the instance.)
    keys: tuple[Key | str, ...] = ()

    def execute(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        raise NotImplementedError

    @functools.cached_property
    def retry_policy(self) -> RetryPolicy:
        """``retry`` with ``retryable_exceptions`` joining its ``retry_on``."""
        return (self.retry or RetryPolicy()).retrying(*self.retryable_exceptions)

    def is_retryable(self, error: BaseException) -> bool:
        """Whether ``error`` earns another attempt: ``fail_on`` first, then ``retry_on``
        (and ``retryable_exceptions``), then the error's own ``retryable``."""
        return self.retry_policy.retries(error)

    # Hooks around each run (before it starts, after it ends); their errors are logged, not fatal.
    def before(self, ctx: JobContext) -> None:
        """Runs before each execution, in the worker thread."""

    def after(self, ctx: JobContext, outcome: str, error: BaseException | None) -> None:
        """Runs after each execution with its outcome (succeeded, failed, ...)."""

    # Hooks on the job's outcome, after it committed (jobs.signals): in the process that
    # wrote it, when that process has this operation registered; errors are logged, not fatal.
    def on_success(self, outcome: JobOutcome, result: Any) -> None:
        """Runs once the job's success committed, with the run's ``result``."""

    def on_failure(self, outcome: JobOutcome, error: JobError) -> None:
        """Runs once the job's final failure committed (not a retry), with its error."""

    @functools.cached_property
    def payload_validator(self) -> PayloadValidator:
        return PayloadValidator(self.payload_schema)

    def validate(self, payload: Any) -> dict[str, list[str]]:
        """Field errors of ``payload`` against the schema (empty when valid)."""
        return self.payload_validator.errors(payload)


# --- payload schemas --------------------------------------------------------------
# The one home of payload validation: local operations' schemas (checked at
# registration) and remote declarations (checked at ``POST /workers``, a 400)
# pass the same ``schema_problem``, and every enqueue goes through a
# ``PayloadValidator``. Schema regexes run on RE2 (``jobs.schema_regex``).
# ``jsonschema`` loads only when needed (``jobs.schema_validator``): the
# metaschema check of a schema ``jobs.schema_precheck`` cannot vouch for,
# and the field errors of a payload the fast path refuses.

# Serialised size and nesting of a payload schema. Real schemas are a few
# kilobytes and a dozen levels; the depth matches the payloads' own limit and
# keeps the metaschema check (about five frames a level) far from Python's
# recursion limit.
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = MAX_DEPTH

# Keywords that only Draft 2020-12 knows; schemas using them skip the fast path.
# So do schemas with regexes: fastjsonschema would run them on Python's ``re``.
_SLOW_PATH_WORDS = (
    "prefixItems",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$dynamicAnchor",
    "minContains",
    "maxContains",
    "$schema",
    "pattern",
)
# Keywords whose values are instances, not schemas: no pattern there is run.
_INSTANCE_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_REFERENCE_KEYWORDS = ("$ref", "$dynamicRef")
# What may stand beside a "$ref" for the fast path: fastjsonschema reads
# schemas as draft 7, where a $ref's sibling keywords are ignored; in 2020-12
# they apply, so a $ref with validating siblings takes the full path.
_REF_NEIGHBOURS = frozenset(
    {"$ref", "$defs", "definitions", "$id", "$anchor", "$comment", "title", "description"}
)


class InvalidPayloadSchema(ControlPlaneError, ValueError):
    """A payload schema that cannot be used; the message says what to change."""


class _NoRemoteReferences(dict[str, Callable[[str], Any]]):
    """fastjsonschema's handlers: every URI scheme refused, so compiling never fetches a URL."""

    def __contains__(self, scheme: object) -> bool:
        return True

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        def refuse(uri: str) -> Any:
            raise InvalidPayloadSchema(f"The payload schema refers to {uri}, outside itself.")

        return refuse


def _schema_nodes(schema: Any) -> list[dict[str, Any]]:
    """Every object of a schema that may be a (sub)schema, instance keywords skipped."""
    nodes, stack = [], [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            nodes.append(item)
            stack.extend(v for k, v in item.items() if k not in _INSTANCE_KEYWORDS)
        elif isinstance(item, list):
            stack.extend(item)
    return nodes


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be a payload schema, as a sentence saying what to change; or None.

    In order, each check protecting the next: storable text and at most
    ``MAX_SCHEMA_DEPTH`` levels (the later checks recurse), at most
    ``MAX_SCHEMA_BYTES``, valid Draft 2020-12 (the metaschema), references
    only to its own parts (nothing is fetched), and patterns RE2 can run.
    """
    if not isinstance(schema, dict):
        return "The payload schema must be a JSON Schema object."
    found = first_unstorable(schema, "payload_schema", max_depth=MAX_SCHEMA_DEPTH)
    if found is not None:
        return f"The payload schema cannot be used: {found[0]} {found[1]}."
    size = len(json.dumps(schema, ensure_ascii=False).encode())
    if size > MAX_SCHEMA_BYTES:
        return (
            f"The payload schema is {size} bytes of JSON; the limit is {MAX_SCHEMA_BYTES} "
            "bytes. Move descriptions elsewhere or simplify it."
        )
    if not known_valid(schema):  # most schemas: jsonschema is not even imported
        from jobs.schema_validator import metaschema_problem

        problem = metaschema_problem(schema)
        if problem is not None:
            return problem
    nodes = _schema_nodes(schema)
    for node in nodes:
        for keyword in _REFERENCE_KEYWORDS:
            target = node.get(keyword)
            if isinstance(target, str) and not target.startswith("#"):
                return (
                    f"The payload schema's {keyword} {_shorten(target, 100)!r} points outside "
                    "the schema; only references to its own parts ('#/$defs/...') are "
                    "followed. Inline what it refers to."
                )
    for node in nodes:
        patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            patterns += list(node["patternProperties"])
        if patterns:  # RE2 loads with the first schema that has a pattern
            from jobs.schema_regex import pattern_problem

            for pattern in patterns:
                if (problem := pattern_problem(pattern)) is not None:
                    return problem
    keywords = {key for node in nodes for key in node}
    if {"unevaluatedProperties", "patternProperties"} <= keywords:
        return (
            "The payload schema combines unevaluatedProperties with patternProperties, "
            "which cannot be checked in linear time here; use additionalProperties instead."
        )
    return None


class PayloadValidator:
    """A payload schema, checked by ``schema_problem`` at once and compiled on first use.

    Valid payloads (the common case at enqueue) are checked by a compiled
    fastjsonschema function in about a microsecond when the schema has no
    regex and no 2020-12-only keyword; field errors always come from
    ``jsonschema`` (Draft 2020-12, regexes on RE2), which has the clearer
    messages and the final word. A payload nested deeper than ``MAX_DEPTH``
    is refused before either runs. Compiling waits for the first payload:
    a worker registers every operation at start-up and validates none.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        problem = schema_problem(schema)
        if problem is not None:
            raise InvalidPayloadSchema(problem)
        self.schema = schema

    @functools.cached_property
    def _fast(self) -> Callable[[Any], Any] | None:
        if any(word in json.dumps(self.schema) for word in _SLOW_PATH_WORDS) or any(
            "$ref" in node and set(node) - _REF_NEIGHBOURS for node in _schema_nodes(self.schema)
        ):
            return None
        import fastjsonschema

        try:
            return fastjsonschema.compile(
                self.schema, handlers=_NoRemoteReferences(), use_formats=False
            )
        except Exception:  # noqa: BLE001 - anything it cannot compile takes the full path
            return None

    @functools.cached_property
    def _full(self) -> Any:
        from jobs.schema_validator import RE2Draft202012Validator

        return RE2Draft202012Validator(self.schema)

    def errors(self, payload: Any) -> dict[str, list[str]]:
        """Field errors of ``payload`` (``payload.<path>`` -> messages); empty when valid."""
        deep = too_deep(payload, "payload")
        if deep is not None:
            return {deep: [f"The value {depth_problem()}."]}
        if self._fast is not None:
            try:
                self._fast(payload)
                return {}
            except Exception:  # noqa: BLE001 - the full validator has the final word
                pass
        from jobs.schema_validator import field_errors

        return field_errors(self._full, payload)


@functools.lru_cache(maxsize=256)
def _validator_for(schema_json: str) -> PayloadValidator | InvalidPayloadSchema:
    """A validator per distinct schema text (a refusal is remembered too)."""
    try:
        return PayloadValidator(json.loads(schema_json))
    except InvalidPayloadSchema as error:
        return error


def validate_against_schema(payload: Any, schema: dict[str, Any]) -> dict[str, list[str]]:
    """Field errors of ``payload`` against ``schema`` (empty when valid).

    A schema that cannot be used (stored before today's checks existed) is
    the operation's error, named under ``operation``; the job is refused.
    """
    validator = _validator_for(json.dumps(schema, sort_keys=True))
    if isinstance(validator, InvalidPayloadSchema):
        return {
            "operation": [
                f"The operation's payload schema cannot be used: {validator} "
                "Its workers must declare it again."
            ]
        }
    return validator.errors(payload)


class FunctionOperation(Operation):
    """An operation built by the ``@operation`` decorator around a plain function."""

    func: Callable[[JobContext, dict[str, Any]], Any]

    def execute(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        return type(self).func(ctx, payload)


class OperationRegistry:
    """Operations by name. One process-wide instance: ``jobs.operations.registry``."""

    def __init__(self) -> None:
        self._ops: dict[str, Operation] = {}

    def register(self, op: type[Operation] | Operation) -> Any:
        instance = op() if isinstance(op, type) else op
        if not instance.name:
            raise ValueError(f"{op!r} has no name; set the class attribute 'name'.")
        _ = instance.payload_validator  # compiles now, so a malformed schema fails at start-up
        timeout = instance.timeout_seconds
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
        ):
            raise ValueError(
                f"The operation {instance.name!r} has timeout_seconds={timeout!r}; "
                "give a number of seconds above 0, or None for no timeout."
            )
        if instance.retry is not None and not isinstance(instance.retry, RetryPolicy):
            raise ValueError(
                f"The operation {instance.name!r} has retry={instance.retry!r}; "
                "give a jobs.retry_policy.RetryPolicy, or None for the knobs' policy."
            )
        _ = instance.retry_policy  # exception classes are checked now, at start-up
        instance.keys = check_declared(instance.name, instance.keys)
        self._ops[instance.name] = instance
        return op

    def unregister(self, name: str) -> None:
        self._ops.pop(name, None)

    def get(self, name: str) -> Operation:
        try:
            return self._ops[name]
        except KeyError:
            raise UnknownOperation(name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def all(self) -> list[Operation]:
        return [self._ops[n] for n in self.names()]


registry = OperationRegistry()


def operation(
    name: str,
    *,
    queue: str = "default",
    max_attempts: int = 1,
    payload_schema: dict[str, Any] | None = None,
    atomic: bool = False,
    retryable_exceptions: tuple[type[BaseException], ...] = (),
    timeout_seconds: float | None = None,
    schedule: str | dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    keys: Sequence[Key | str] = (),
    target: OperationRegistry | None = None,
    on_success: Callable[[JobOutcome, Any], None] | None = None,
    on_failure: Callable[[JobOutcome, JobError], None] | None = None,
) -> Callable[[Callable[[JobContext, dict[str, Any]], Any]], Callable[..., Any]]:
    """Register a function ``func(ctx, payload)`` as an operation (``retry``: its policy)."""

    def decorate(func: Callable[[JobContext, dict[str, Any]], Any]) -> Callable[..., Any]:
        cls = type(
            f"{func.__name__}_operation",
            (FunctionOperation,),
            {
                "name": name,
                "queue": queue,
                "max_attempts": max_attempts,
                "payload_schema": payload_schema or {"type": "object"},
                "atomic": atomic,
                "retryable_exceptions": retryable_exceptions,
                "timeout_seconds": timeout_seconds,
                "schedule": schedule,
                "retry": retry,
                "keys": tuple(keys),
                "description": (func.__doc__ or "").strip(),
                "func": staticmethod(func),
                **_outcome_hooks(on_success=on_success, on_failure=on_failure),
            },
        )
        (target or registry).register(cls)
        return func

    return decorate


def _outcome_hooks(**hooks: Callable[..., None] | None) -> dict[str, Any]:
    """``@operation``'s ``on_success``/``on_failure`` functions as the class's hook methods.

    Only those given: an operation without hooks keeps ``Operation``'s, so
    ``jobs.signals`` sees that nothing needs its outcomes.
    """
    methods: dict[str, Any] = {}
    for name, hook in hooks.items():
        if hook is None:
            continue
        if not callable(hook):
            raise TypeError(f"@operation({name}={hook!r}): give a function (outcome, ...) -> None.")
        methods[name] = staticmethod(hook)
    return methods


DIAGNOSTICS_MODULE = "jobs.diagnostics"


def discover_operations(modules: list[str]) -> None:
    """Import every module that registers operations (settings, then each app's ``operations``).

    The diagnostic operations (``jobs.diagnostics``: ``ping``, ``sleep``…) are left out,
    even when listed, while the knob ``DIAGNOSTIC_OPERATIONS`` is false.
    """
    from django.apps import apps

    from jobs.conf import knob

    diagnostics = bool(knob("DIAGNOSTIC_OPERATIONS"))
    for module in modules:
        if module == DIAGNOSTICS_MODULE and not diagnostics:
            continue
        importlib.import_module(module)
    for app in apps.get_app_configs():
        candidate = f"{app.name}.operations"
        if app.name == "jobs":
            continue
        try:
            importlib.import_module(candidate)
        except ModuleNotFoundError as error:
            if error.name != candidate:
                raise


@dataclass(frozen=True)
class RemoteOperationSpec:
    """What enqueue needs of an operation declared by remote workers."""

    name: str
    queue: str
    max_attempts: int
    payload_schema: dict[str, Any]
    # Remote declarations carry no timeout (yet): a job's own ``timeout_seconds`` applies.
    timeout_seconds: float | None = None

    def validate(self, payload: Any) -> dict[str, list[str]]:
        return validate_against_schema(payload, self.payload_schema or {"type": "object"})


def operation_spec(name: str) -> Operation | RemoteOperationSpec:
    """Resolve ``name`` for enqueue: a local operation, else a remote declaration that a
    worker serves or served within ``REMOTE_OPERATION_GRACE_SECONDS`` (``jobs.remote_operations``).

    Raises ``UnknownOperation``, whose message says which of the two it is not.
    """
    if name in registry:
        return registry.get(name)
    from jobs.remote_operations import declared_operation

    remote = declared_operation(name)
    return RemoteOperationSpec(
        name=remote.name,
        queue=remote.queue,
        max_attempts=remote.max_attempts,
        payload_schema=remote.payload_schema,
    )
