"""OpenTelemetry across machines: the claim carries the enqueuer's trace context and the
Python client's run span continues it (the client run in this process, against the server)."""

from __future__ import annotations

import threading

import pytest
from controlplane_client import JobManager, TokenApi
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.integration.tracing.spans import installed, spans, traceparent  # noqa: F401 - fixture

from .helpers import ECHO, job_status, register

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_claim_carries_the_stored_trace_context(api, server, spans):  # noqa: F811
    worker = register(api, [ECHO], concurrency=2)
    with trace.get_tracer("test").start_as_current_span("POST /orders"):
        traced = enqueue("remote.echo", {"text": "traced"})
    with installed(None):  # no SDK, no current span: nothing stored
        untraced = enqueue("remote.echo", {"text": "not traced"})
    claimed = api.post(f"/workers/{worker['id']}/claim", json={"limit": 2}).json()["jobs"]
    by_id = {job["id"]: job for job in claimed}
    assert by_id[str(traced.pk)]["trace_context"] == {
        "traceparent": traceparent(spans.enqueue_of(traced.pk))
    }
    assert by_id[str(untraced.pk)]["trace_context"] is None


def test_the_clients_run_span_continues_the_enqueuers_trace(server, token, spans):  # noqa: F811
    seen: dict[str, int] = {}
    done = threading.Event()
    manager = JobManager(TokenApi(server.url, token), websocket=False, long_poll=1.0)

    @manager.operation("remote.traced", queue="remote")
    def traced(job):
        seen["span_id"] = trace.get_current_span().get_span_context().span_id
        done.set()
        return {"ok": True}

    @manager.operation("remote.refused", queue="remote")
    def refused(job):
        raise RuntimeError("the printer is on fire")

    manager.connect()
    try:
        with trace.get_tracer("test").start_as_current_span("POST /orders") as request:
            ok = enqueue("remote.traced", {})
            bad = enqueue("remote.refused", {})
        assert done.wait(15), "the handler never ran"
        wait_for(lambda: job_status(ok.pk) == "succeeded", message="the success report")
        wait_for(lambda: job_status(bad.pk) == "failed", message="the failure report")
    finally:
        manager.disconnect()

    run = spans.one("controlplane.run remote.traced")
    assert run.instrumentation_scope.name == "controlplane-client"
    assert run.kind is SpanKind.CONSUMER
    assert run.context.trace_id == request.get_span_context().trace_id
    assert run.parent.span_id == spans.enqueue_of(ok.pk).context.span_id
    assert run.attributes["controlplane.job.id"] == str(ok.pk)
    assert run.attributes["controlplane.job.outcome"] == "succeeded"
    assert seen["span_id"] == run.context.span_id  # current while the handler ran

    failed = spans.one("controlplane.run remote.refused")
    assert failed.attributes["controlplane.job.outcome"] == "failed"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "RuntimeError: the printer is on fire"
    assert [event.name for event in failed.events] == ["exception"]
    assert failed.parent.span_id == spans.enqueue_of(bad.pk).context.span_id
