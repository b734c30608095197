"""The OpenTelemetry side of ``jobs.tracing``: spans, the tracer, the propagator.

Imported by ``jobs.tracing`` only once something in the process could
have made a span (``jobs.tracing.api_in_use``): the OpenTelemetry API is
about 2% of a worker's start-up, and an untraced process never needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from jobs.claims import ClaimedJob

TRACER_NAME = "django-controlplane"
ENQUEUE_SPAN = "controlplane.enqueue"
RUN_SPAN = "controlplane.run"

# Span attributes (bounded values only: no payloads).
OPERATION = "controlplane.operation"
QUEUE = "controlplane.queue"
JOB_ID = "controlplane.job.id"
JOB_COUNT = "controlplane.job.count"
DUPLICATES = "controlplane.job.duplicates"
ATTEMPT = "controlplane.job.attempt"
OUTCOME = "controlplane.job.outcome"

# Run outcomes (``workers.execution.Outcome.status``) that mark the run span as an error.
ERROR_OUTCOMES = frozenset({"failed", "retry_scheduled", "outage_requeue", "lease_lost", "lost"})
# Characters of an error message a span's status carries (the job's event keeps all of it).
MAX_DESCRIPTION_CHARS = 500

_NO_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_cached: tuple[object, trace.Tracer] | None = None


@functools.cache
def _version() -> str | None:
    """This package's version for the tracer (looked up once, when the first span is made)."""
    try:
        return metadata.version("django-controlplane")
    except metadata.PackageNotFoundError:
        return None


def sdk_configured() -> bool:
    """True once a real tracer provider (an SDK) is installed, by code or by environment."""
    return not isinstance(trace.get_tracer_provider(), _NO_PROVIDERS)


def tracing_on() -> bool:
    """Whether an enqueue should open a span and store a context.

    A current span with a valid context (a traced request, a traced run) is
    worth continuing even without an SDK in this process: the context is
    propagated as it is. With an SDK and no current span, the enqueue span
    starts a trace of its own.
    """
    return trace.get_current_span().get_span_context().is_valid or sdk_configured()


def tracer() -> trace.Tracer:
    """This project's tracer from the current global provider.

    Looked up per provider rather than once at import (``trace.get_tracer``
    would pin the provider in place when the module was imported).
    """
    global _cached
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(TRACER_NAME, _version()))
    return cached[1]


# --- enqueue ------------------------------------------------------------------------


@contextmanager
def enqueue_span(count: int) -> Iterator[dict[str, str] | None]:
    """The ``controlplane.enqueue`` span around storing ``count`` jobs; yields the carrier.

    The carrier (``{"traceparent": …}``, None when the propagator wrote
    nothing) is what each job stores. An exception leaving the block is
    recorded on the span, which then has error status.
    """
    with tracer().start_as_current_span(
        ENQUEUE_SPAN, kind=SpanKind.PRODUCER, attributes={JOB_COUNT: count}
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier or None


def describe_enqueue(jobs: Sequence[Any]) -> None:
    """Name the jobs just stored on the current (enqueue) span.

    Operation and queue when the call had one of each, the job id when it
    stored one job, and how many were duplicates (a held ``unique_key``).
    """
    span = trace.get_current_span()
    if not span.is_recording() or not jobs:
        return
    operations = {job.operation for job in jobs}
    queues = {job.queue for job in jobs}
    attributes: dict[str, Any] = {}
    if len(operations) == 1:
        attributes[OPERATION] = next(iter(operations))
    if len(queues) == 1:
        attributes[QUEUE] = next(iter(queues))
    if len(jobs) == 1:
        attributes[JOB_ID] = str(jobs[0].id)
    duplicates = sum(1 for job in jobs if getattr(job, "duplicate", False))
    if duplicates:
        attributes[DUPLICATES] = duplicates
    span.set_attributes(attributes)


# --- run ----------------------------------------------------------------------------


@contextmanager
def run_span(job: ClaimedJob, carrier: dict[str, str] | None) -> Iterator[trace.Span]:
    """The ``controlplane.run <operation>`` span; see ``jobs.tracing.run_span``."""
    # The stored context becomes current (its baggage too); without one the run
    # starts a trace of its own rather than joining whatever this thread had.
    empty = otel_context.Context()
    if carrier:
        parent = propagate.extract(carrier, context=empty)
    else:
        parent = trace.set_span_in_context(trace.INVALID_SPAN, empty)
    token = otel_context.attach(parent)
    try:
        with tracer().start_as_current_span(
            f"{RUN_SPAN} {job.operation}",
            kind=SpanKind.CONSUMER,
            attributes={
                JOB_ID: str(job.id),
                OPERATION: job.operation,
                QUEUE: job.queue,
                ATTEMPT: job.attempt,
            },
        ) as span:
            yield span
    finally:
        otel_context.detach(token)


def end_run(
    span: trace.Span | None,
    outcome: str,
    error: BaseException | None = None,
    error_code: str = "",
    error_message: str = "",
) -> None:
    """Record a run's outcome on its span; failures get error status and their exception."""
    if span is None or not span.is_recording():
        return
    span.set_attribute(OUTCOME, outcome)
    if outcome in ERROR_OUTCOMES:
        if error is not None:
            span.record_exception(error)
        description = f"{error_code}: {error_message}" if error_code else outcome
        span.set_status(Status(StatusCode.ERROR, description[:MAX_DESCRIPTION_CHARS]))
