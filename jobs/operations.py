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
"""

from __future__ import annotations

import functools
import importlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import fastjsonschema
import jsonschema

from jobs.exceptions import JobCancelled, RetryLaterError, UnknownOperation

if TYPE_CHECKING:
    from jobs.claims import ClaimedJob

__all__ = [
    "JobContext",
    "Operation",
    "OperationRegistry",
    "OperationResult",
    "RetryLaterError",
    "operation",
    "registry",
]


@dataclass(frozen=True)
class OperationResult:
    """What an operation may return instead of a plain result.

    ``deferred=True`` keeps the job ``running`` after the operation returns:
    a coordinator whose batches close it later.
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

    def progress(self, current: int, total: int | None = None, message: str | None = None) -> int:
        fields: dict[str, Any] = {"_progress_current": current}
        if total is not None:
            fields["_progress_total"] = total
        return self.emit("job.progress", message, **fields)


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
    description: ClassVar[str] = ""

    def execute(self, ctx: JobContext, payload: dict[str, Any]) -> Any:
        raise NotImplementedError

    def is_retryable(self, error: BaseException) -> bool:
        return isinstance(error, self.retryable_exceptions) or bool(
            getattr(error, "retryable", False)
        )

    # Hooks (Sourcegraph's PreHandle / PostHandle). Errors in hooks are logged, not fatal.
    def before(self, ctx: JobContext) -> None:
        """Runs before each execution, in the worker thread."""

    def after(self, ctx: JobContext, outcome: str, error: BaseException | None) -> None:
        """Runs after each execution with its outcome (succeeded, failed, ...)."""

    @functools.cached_property
    def payload_validator(self) -> PayloadValidator:
        return PayloadValidator(self.payload_schema)

    def validate(self, payload: Any) -> dict[str, list[str]]:
        """Field errors of ``payload`` against the schema (empty when valid)."""
        return self.payload_validator.errors(payload)


# Keywords that only Draft 2020-12 knows; schemas using them skip the fast path.
_MODERN_KEYWORDS = (
    "prefixItems",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$dynamicAnchor",
    "minContains",
    "maxContains",
)


class PayloadValidator:
    """A payload schema compiled once.

    Valid payloads (the common case at enqueue) are checked by a compiled
    fastjsonschema function in about a microsecond; field errors always come
    from ``jsonschema`` (Draft 2020-12), which has the clearer messages and
    the final word.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        jsonschema.Draft202012Validator.check_schema(schema)
        self.schema = schema
        self._full = jsonschema.Draft202012Validator(schema)
        self._fast: Callable[[Any], Any] | None = None
        if not any(k in json.dumps(schema) for k in _MODERN_KEYWORDS):
            try:
                self._fast = fastjsonschema.compile(schema)
            except Exception:  # noqa: BLE001 - anything it cannot compile takes the full path
                self._fast = None

    def errors(self, payload: Any) -> dict[str, list[str]]:
        if self._fast is not None:
            try:
                self._fast(payload)
                return {}
            except fastjsonschema.JsonSchemaException:
                pass
        errors: dict[str, list[str]] = {}
        for error in sorted(self._full.iter_errors(payload), key=lambda e: list(e.path)):
            path = "payload" + "".join(f".{p}" for p in error.absolute_path)
            if error.validator == "required":
                missing = error.message.split("'")[1] if "'" in error.message else ""
                path = f"{path}.{missing}" if missing else path
            errors.setdefault(path, []).append(error.message)
        return errors


def validate_against_schema(payload: Any, schema: dict[str, Any]) -> dict[str, list[str]]:
    """Field errors of ``payload`` against ``schema`` (empty when valid)."""
    return PayloadValidator(schema).errors(payload)


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
    target: OperationRegistry | None = None,
) -> Callable[[Callable[[JobContext, dict[str, Any]], Any]], Callable[..., Any]]:
    """Register a function ``func(ctx, payload)`` as an operation."""

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
                "description": (func.__doc__ or "").strip(),
                "func": staticmethod(func),
            },
        )
        (target or registry).register(cls)
        return func

    return decorate


def discover_operations(modules: list[str]) -> None:
    """Import every module that registers operations (settings, then each app's ``operations``)."""
    from django.apps import apps

    for module in modules:
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

    def validate(self, payload: Any) -> dict[str, list[str]]:
        return validate_against_schema(payload, self.payload_schema or {"type": "object"})


def operation_spec(name: str) -> Operation | RemoteOperationSpec:
    """Resolve ``name`` for enqueue: a local operation, else a live remote declaration."""
    if name in registry:
        return registry.get(name)
    from jobs.models import RemoteOperation

    remote = RemoteOperation.objects.filter(name=name, deleted=False).first()
    if remote is None:
        raise UnknownOperation(name)
    return RemoteOperationSpec(
        name=remote.name,
        queue=remote.queue,
        max_attempts=remote.max_attempts,
        payload_schema=remote.payload_schema,
    )
