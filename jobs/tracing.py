"""OpenTelemetry spans for enqueue and run, and the trace context a job carries between them.

The core needs only ``opentelemetry-api``: without an SDK every call here is
a no-op, and the SDK, its exporters and its sampler are the operator's choice
(docs/observability.md, "Tracing").

- ``enqueue_span`` wraps ``enqueue_many``: one ``controlplane.enqueue`` span
  (kind PRODUCER) per call, a child of whatever span is current (a request
  span from ``opentelemetry-instrumentation-django``, a job's run span when an
  operation enqueues). Its context, injected by the global propagator (W3C
  ``traceparent``/``tracestate`` by default), is stored with every job of the
  call in ``Job.trace_context``, in the same INSERT.
- ``run_span`` wraps each run: ``controlplane.run <operation>`` (kind
  CONSUMER), whose parent is the stored context, so a trace reads
  request → enqueue → run even across processes and machines. Remote workers
  get the same context in their claim's JSON (``trace_context``).

Cost when nothing is traced (no SDK, no current span): nothing is stored
and no span object is made. Until something in the process could have made
a span (``api_in_use``: the OpenTelemetry API imported by an SDK, by
auto-instrumentation or by an operation, or a tracer provider named by the
environment), the API is not even imported (about 2% of a worker's
start-up) and ``tracing_on`` is a dictionary lookup; the code that uses the
API is ``jobs.tracing_spans``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from jobs.claims import ClaimedJob

# A stored carrier is small (traceparent 55 characters, tracestate at most 512);
# anything larger or stranger is not ours and is ignored rather than propagated.
MAX_CARRIER_ITEMS = 8
MAX_CARRIER_CHARS = 8192
# The environment variable by which the API loads a tracer provider on first use.
PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"

_NO_SPAN: AbstractContextManager[None] = nullcontext()


def api_in_use() -> bool:
    """Whether anything in this process could have made a span or installed an SDK.

    Both take ``opentelemetry.trace`` imported (an SDK, auto-instrumentation,
    an instrumented request or operation), or a provider named by the
    environment, which the API loads on its first use. Otherwise there is
    no span to continue and no SDK to start one.
    """
    return "opentelemetry.trace" in sys.modules or PROVIDER_VARIABLE in os.environ


def sdk_configured() -> bool:
    """True once a real tracer provider (an SDK) is installed, by code or by environment."""
    if not api_in_use():
        return False
    from jobs import tracing_spans

    return tracing_spans.sdk_configured()


def tracing_on() -> bool:
    """Whether an enqueue should open a span and store a context.

    A current span with a valid context (a traced request, a traced run) is
    worth continuing even without an SDK in this process: the context is
    propagated as it is. With an SDK and no current span, the enqueue span
    starts a trace of its own.
    """
    if not api_in_use():
        return False
    from jobs import tracing_spans

    return tracing_spans.tracing_on()


# --- enqueue (called when ``tracing_on()``) ------------------------------------------


def enqueue_span(count: int) -> AbstractContextManager[dict[str, str] | None]:
    """The ``controlplane.enqueue`` span around storing ``count`` jobs; yields the carrier.

    The carrier (``{"traceparent": …}``, None when the propagator wrote
    nothing) is what each job stores. An exception leaving the block is
    recorded on the span, which then has error status.
    """
    from jobs import tracing_spans

    return tracing_spans.enqueue_span(count)


def describe_enqueue(jobs: Sequence[Any]) -> None:
    """Name the jobs just stored on the current (enqueue) span (``tracing_spans``)."""
    from jobs import tracing_spans

    tracing_spans.describe_enqueue(jobs)


# --- run ----------------------------------------------------------------------------


def carrier_of(value: Any) -> dict[str, str] | None:
    """A stored carrier as the propagator reads it, or None when it is not one."""
    if not isinstance(value, Mapping) or not value or len(value) > MAX_CARRIER_ITEMS:
        return None
    carrier = {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
    if sum(len(k) + len(v) for k, v in carrier.items()) > MAX_CARRIER_CHARS:
        return None
    return carrier or None


def run_span(job: ClaimedJob) -> AbstractContextManager[Span | None]:
    """The ``controlplane.run <operation>`` span around one run, current while it runs.

    Its parent is the job's stored context (the enqueue span). Yields None,
    and costs nothing, when the job carries no context and no SDK is
    installed; with a context but no SDK, the stored context is still made
    current, so the operation's own outgoing calls continue the trace.
    Call ``end_run`` with the outcome before leaving the block.
    """
    carrier = carrier_of(job.trace_context) if job.trace_context is not None else None
    if carrier is None and not sdk_configured():
        return _NO_SPAN
    from jobs import tracing_spans

    return tracing_spans.run_span(job, carrier)


def end_run(
    span: Span | None,
    outcome: str,
    error: BaseException | None = None,
    error_code: str = "",
    error_message: str = "",
) -> None:
    """Record a run's outcome on its span; failures get error status and their exception."""
    if span is None:
        return
    from jobs import tracing_spans

    tracing_spans.end_run(span, outcome, error, error_code, error_message)
