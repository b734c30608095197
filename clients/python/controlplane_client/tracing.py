"""OpenTelemetry run spans for remote workers, when ``opentelemetry-api`` is installed.

The client does not need OpenTelemetry (``pip install controlplane-client[tracing]``
adds the API; the SDK and its exporters are the operator's choice). With it,
each run is a ``controlplane.run <operation>`` span (kind CONSUMER) whose
parent is the enqueuer's context from the claim (``trace_context``), so a
trace reads request → enqueue → run across machines, and the span is current
while the handler runs (its own spans and traced calls nest under it).

Without the API, or with neither a stored context nor an SDK, ``run_traced``
simply calls the handler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from controlplane_client.api import JobCancelledError, LeaseLostError
from controlplane_client.jobs import Deferred

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # tracing is optional
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from controlplane_client.jobs import ClaimedJob

__all__ = ["TRACER_NAME", "run_traced"]

TRACER_NAME = "controlplane-client"
RUN_SPAN = "controlplane.run"
# The attributes of the server's spans (jobs.tracing), so both kinds of run read alike.
JOB_ID = "controlplane.job.id"
OPERATION = "controlplane.operation"
QUEUE = "controlplane.queue"
ATTEMPT = "controlplane.job.attempt"
OUTCOME = "controlplane.job.outcome"
MAX_CARRIER_ITEMS = 8
MAX_CARRIER_CHARS = 8192
MAX_DESCRIPTION_CHARS = 500

_cached: tuple[object, Any] | None = None


def _tracer() -> Any:
    """The client's tracer from the current global provider (looked up per provider)."""
    global _cached
    provider = trace.get_tracer_provider()
    cached = _cached
    if cached is None or cached[0] is not provider:
        cached = _cached = (provider, provider.get_tracer(TRACER_NAME))
    return cached[1]


def _sdk_configured() -> bool:
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _carrier(value: Any) -> dict[str, str] | None:
    """The claim's ``trace_context`` as the propagator reads it, or None when it is not one."""
    if not isinstance(value, Mapping) or not value or len(value) > MAX_CARRIER_ITEMS:
        return None
    carrier = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    if sum(len(k) + len(v) for k, v in carrier.items()) > MAX_CARRIER_CHARS:
        return None
    return carrier or None


def run_traced(job: ClaimedJob, call: Callable[[ClaimedJob], Any]) -> Any:
    """``call(job)`` inside the job's run span; the span records the outcome.

    ``succeeded`` or ``deferred`` when ``call`` returns; ``failed`` (error
    status, the exception recorded) when it raises, whether or not the
    server then schedules another attempt; ``cancelled`` or ``lease_lost``
    when the job was taken away. Exceptions propagate unchanged. Usable in
    manual mode too: ``run_traced(job, handler)``.
    """
    if trace is None:
        return call(job)
    carrier = _carrier(job.trace_context)
    if carrier is None and not _sdk_configured():
        return call(job)
    empty = otel_context.Context()
    if carrier:
        parent = propagate.extract(carrier, context=empty)
    else:  # a job enqueued while nothing was traced: a trace of its own
        parent = trace.set_span_in_context(trace.INVALID_SPAN, empty)
    token = otel_context.attach(parent)
    try:
        with _tracer().start_as_current_span(
            f"{RUN_SPAN} {job.operation}",
            kind=SpanKind.CONSUMER,
            attributes={
                JOB_ID: job.id,
                OPERATION: job.operation,
                QUEUE: job.queue,
                ATTEMPT: job.attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                value = call(job)
            except JobCancelledError:
                span.set_attribute(OUTCOME, "cancelled")
                raise
            except LeaseLostError as error:
                span.set_attribute(OUTCOME, "lease_lost")
                span.set_status(Status(StatusCode.ERROR, error.message[:MAX_DESCRIPTION_CHARS]))
                raise
            except BaseException as error:
                span.set_attribute(OUTCOME, "failed")
                span.record_exception(error)
                description = f"{type(error).__name__}: {error}"
                span.set_status(Status(StatusCode.ERROR, description[:MAX_DESCRIPTION_CHARS]))
                raise
            span.set_attribute(OUTCOME, "deferred" if isinstance(value, Deferred) else "succeeded")
            return value
    finally:
        otel_context.detach(token)
