"""An SDK tracer provider with an in-memory exporter, for the tracing tests here and elsewhere.

OpenTelemetry lets a process set its global provider once; these tests need
"no SDK" and "an SDK" in one process, so ``installed`` swaps the API's globals
the way OpenTelemetry's own test utilities do (``reset_trace_globals``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


@contextmanager
def installed(provider: trace.TracerProvider | None) -> Iterator[None]:
    """Make ``provider`` the global tracer provider (None: no SDK) for the block."""
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)
    try:
        yield
    finally:
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def traceparent(span: object) -> str:
    """The W3C header naming ``span`` (a finished SDK span or an API span)."""
    context = span.context if hasattr(span, "context") else span.get_span_context()  # type: ignore[attr-defined]
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


class Spans:
    """The spans finished so far, by name."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def enqueue_of(self, job_id: object) -> ReadableSpan:
        """The ``controlplane.enqueue`` span that stored the job ``job_id``."""
        [found] = [
            span
            for span in self.named("controlplane.enqueue")
            if span.attributes.get("controlplane.job.id") == str(job_id)
        ]
        return found

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"{len(found)} spans named {name!r}: {[s.name for s in self.all()]}"
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    """An SDK tracer provider for this test, its spans kept in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with installed(provider):
        yield Spans(exporter)
    provider.shutdown()


@pytest.fixture
def no_sdk() -> Iterator[None]:
    """No tracer provider at all, as in a deployment that did not configure tracing."""
    with installed(None):
        yield
