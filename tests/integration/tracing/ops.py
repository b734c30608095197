"""Operations of the tracing tests, and (in worker processes) an SDK that writes spans to a file.

A worker process imports this module through ``CONTROLPLANE_OPERATION_MODULES``;
with ``CONTROLPLANE_TEST_SPANS_FILE`` set it installs a tracer provider whose
exporter appends each finished span to that file as one JSON line, which is
how an operator's SDK set-up in settings or an operations module looks.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import trace

from jobs.enqueue import enqueue
from jobs.operations import operation

SPANS_FILE_ENV = "CONTROLPLANE_TEST_SPANS_FILE"


def current_ids() -> dict[str, str]:
    """The current span's trace and span ids, as hex."""
    context = trace.get_current_span().get_span_context()
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


@operation("tracing.echo", queue="tracing")
def echo(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Returns the span current while it ran."""
    return current_ids()


@operation("tracing.boom", queue="tracing", retryable_exceptions=(ValueError,))
def boom(ctx: Any, payload: dict[str, Any]) -> None:
    raise ValueError("the upstream said no")


@operation("tracing.fanout", queue="tracing")
def fanout(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Enqueues a child from inside its run: the child's enqueue joins this run's trace."""
    child = enqueue("tracing.echo", {}, parent=ctx.job_id)
    return {"child": str(child.pk), **current_ids()}


def _install_file_exporter(path: str) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    trace.set_tracer_provider(provider)


if os.environ.get(SPANS_FILE_ENV):
    _install_file_exporter(os.environ[SPANS_FILE_ENV])
