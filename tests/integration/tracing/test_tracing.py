"""OpenTelemetry: enqueue and run spans, and the trace context a job carries between them.

A trace reads request → enqueue → run: the enqueue span is a child of the
span current at enqueue (here a stand-in for a Django request span), its
context is stored with the job, and the run span, in whatever process runs
the job, is its child.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs.conf import DEFAULTS
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job
from workers.config import WorkerConfig
from workers.engine import JobWorker

from .ops import SPANS_FILE_ENV
from .spans import installed, traceparent

pytestmark = pytest.mark.django_db(transaction=True)

TEST_MODULES = ",".join([*DEFAULTS["OPERATION_MODULES"], "tests.integration.tracing.ops"])


def request_span() -> trace.Span:
    """A span standing in for the request span ``opentelemetry-instrumentation-django`` opens."""
    return trace.get_tracer("test").start_as_current_span("GET /orders", kind=SpanKind.SERVER)


def drain(queue: str = "tracing") -> None:
    """Run the queue's jobs in this process through the real worker (claim, run, record);
    retries are due at once, so a burst runs them too."""
    config = WorkerConfig(
        queues=(queue,), concurrency=1, burst=True, poll_seconds=0.05, retry_backoff_seconds=0
    )
    assert JobWorker(config).run(install_signals=False) == 0


def stored(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_an_enqueue_inside_a_request_span_is_its_child_and_stores_its_own_context(spans):
    with request_span() as request:
        job = enqueue("tracing.echo", {})
    enqueue_span = spans.one("controlplane.enqueue")
    assert enqueue_span.kind is SpanKind.PRODUCER
    assert enqueue_span.parent.span_id == request.get_span_context().span_id
    assert enqueue_span.context.trace_id == request.get_span_context().trace_id
    assert dict(enqueue_span.attributes) == {
        "controlplane.job.count": 1,
        "controlplane.operation": "tracing.echo",
        "controlplane.queue": "tracing",
        "controlplane.job.id": str(job.pk),
    }
    # Stored by the INSERT itself, and returned on the enqueued job as well.
    assert stored(job).trace_context == {"traceparent": traceparent(enqueue_span)}
    assert job.trace_context == stored(job).trace_context


def test_a_bulk_enqueue_is_one_span_counting_its_jobs(spans):
    jobs = enqueue_many([JobSpec("tracing.echo"), JobSpec("tracing.echo"), JobSpec("tracing.boom")])
    enqueue_span = spans.one("controlplane.enqueue")
    assert enqueue_span.parent is None  # no request: the enqueue starts the trace
    assert enqueue_span.attributes["controlplane.job.count"] == 3
    assert enqueue_span.attributes["controlplane.queue"] == "tracing"
    assert "controlplane.operation" not in enqueue_span.attributes  # two operations
    assert "controlplane.job.id" not in enqueue_span.attributes
    contexts = {json.dumps(stored(job).trace_context) for job in jobs}
    assert contexts == {json.dumps({"traceparent": traceparent(enqueue_span)})}


def test_a_refused_enqueue_is_an_error_span_and_stores_nothing(spans):
    with pytest.raises(Exception, match="not enqueued"):
        enqueue("tracing.echo", {}, priority=1000)
    enqueue_span = spans.one("controlplane.enqueue")
    assert enqueue_span.status.status_code is StatusCode.ERROR
    assert [event.name for event in enqueue_span.events] == ["exception"]
    refute_enqueued()


def test_the_run_span_continues_the_enqueuers_trace(spans):
    with request_span() as request:
        job = enqueue("tracing.echo", {})
    drain()  # the worker's threads start with no current context: only the stored one links
    enqueue_span = spans.one("controlplane.enqueue")
    run = spans.one("controlplane.run tracing.echo")
    assert run.kind is SpanKind.CONSUMER
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent.span_id == enqueue_span.context.span_id
    assert dict(run.attributes) == {
        "controlplane.job.id": str(job.pk),
        "controlplane.operation": "tracing.echo",
        "controlplane.queue": "tracing",
        "controlplane.job.attempt": 1,
        "controlplane.job.outcome": "succeeded",
    }
    assert run.status.status_code is StatusCode.UNSET
    # The run span is current while the operation runs: its own spans nest under it.
    assert stored(job).result == {
        "trace_id": f"{run.context.trace_id:032x}",
        "span_id": f"{run.context.span_id:016x}",
    }


def test_a_failed_run_records_its_exception_and_error_status(spans):
    job = enqueue("tracing.boom", {}, max_attempts=2)
    drain()
    first, second = sorted(
        spans.named("controlplane.run tracing.boom"),
        key=lambda s: s.attributes["controlplane.job.attempt"],
    )
    assert first.attributes["controlplane.job.outcome"] == "retry_scheduled"
    assert second.attributes["controlplane.job.outcome"] == "failed"
    for run in (first, second):
        assert run.status.status_code is StatusCode.ERROR
        assert run.status.description == "ValueError: the upstream said no"
        [event] = run.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        # Both attempts continue the same enqueue.
        assert run.parent.span_id == spans.one("controlplane.enqueue").context.span_id
    assert stored(job).status == "failed"


def test_a_job_enqueued_by_a_run_continues_the_same_trace(spans):
    with request_span() as request:
        parent = enqueue("tracing.fanout", {})
    drain()
    first_enqueue, child_enqueue = sorted(
        spans.named("controlplane.enqueue"), key=lambda s: s.start_time
    )
    fanout = spans.one("controlplane.run tracing.fanout")
    echo = spans.one("controlplane.run tracing.echo")
    # request → enqueue → run(fanout) → enqueue(child) → run(echo): one trace.
    assert fanout.parent.span_id == first_enqueue.context.span_id
    assert child_enqueue.parent.span_id == fanout.context.span_id
    assert echo.parent.span_id == child_enqueue.context.span_id
    trace_ids = {s.context.trace_id for s in spans.all()}
    assert trace_ids == {request.get_span_context().trace_id}
    [child] = assert_enqueued("tracing.echo", parent=parent, count=1)
    assert str(child.pk) == stored(parent).result["child"]


def test_without_tracing_nothing_is_stored_and_enqueue_costs_no_extra_query(no_sdk):
    assert not trace.get_current_span().get_span_context().is_valid
    with CaptureQueriesContext(connection) as untraced:
        job = enqueue("tracing.echo", {})
    assert stored(job).trace_context is None
    assert job.trace_context is None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with installed(provider), CaptureQueriesContext(connection) as traced:
        traced_job = enqueue("tracing.echo", {})
    [enqueue_span] = exporter.get_finished_spans()
    # Tracing or not, the enqueue is the same statements: the context rides in the INSERT.
    # SQLite: the INSERT inside its savepoint (the enqueue event is implied: jobs.timeline).
    assert len(traced) == len(untraced) == (1 if connection.vendor == "postgresql" else 3)
    assert stored(traced_job).trace_context == {"traceparent": traceparent(enqueue_span)}
    # And an untraced job still runs (no span, nothing to continue).
    drain()
    assert stored(job).status == "succeeded"


def test_a_propagated_context_is_carried_through_without_an_sdk(no_sdk):
    """A context extracted from a request (no SDK in this process) still reaches the run."""
    remote = SpanContext(
        trace_id=uuid.uuid4().int,
        span_id=uuid.uuid4().int >> 64,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    with trace.use_span(NonRecordingSpan(remote)):
        job = enqueue("tracing.echo", {})
    assert stored(job).trace_context == {"traceparent": traceparent(NonRecordingSpan(remote))}
    drain()
    assert stored(job).result == {
        "trace_id": f"{remote.trace_id:032x}",
        "span_id": f"{remote.span_id:016x}",
    }


def test_a_worker_process_continues_the_trace(spans, start_process, tmp_path):
    spans_file = tmp_path / "worker-spans.jsonl"
    with request_span():
        job = enqueue("tracing.echo", {})
    worker = start_process(
        "runworker",
        "--queue",
        "tracing",
        "--burst",
        env={"CONTROLPLANE_OPERATION_MODULES": TEST_MODULES, SPANS_FILE_ENV: str(spans_file)},
    )
    assert worker.wait(timeout=60) == 0, worker.output()
    assert stored(job).status == "succeeded"
    [run] = [json.loads(line) for line in spans_file.read_text().splitlines()]
    enqueue_span = spans.one("controlplane.enqueue")
    assert run["name"] == "controlplane.run tracing.echo"
    assert run["kind"] == "SpanKind.CONSUMER"
    assert run["context"]["trace_id"] == f"0x{enqueue_span.context.trace_id:032x}"
    assert run["parent_id"] == f"0x{enqueue_span.context.span_id:016x}"
    assert run["attributes"]["controlplane.job.id"] == str(job.pk)
    assert run["attributes"]["controlplane.job.outcome"] == "succeeded"
