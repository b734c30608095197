"""A failing job run by a real ``runworker``: its events keep the traceback; it logs a WARNING."""

from __future__ import annotations

import re

import pytest

from jobs.enqueue import enqueue
from jobs.failures import fingerprint
from jobs.models import Job, JobEvent
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def failure_events(job: Job) -> list[JobEvent]:
    return list(
        JobEvent.objects.filter(
            job_id=job.pk, event__in=["job.failed", "job.retry_scheduled"]
        ).order_by("seq")
    )


def test_a_failed_job_keeps_its_traceback_and_the_worker_warns(worker):
    job = enqueue("fail", {"message": "disk 7 is <full>"}, max_attempts=1)
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=60) == 0, proc.output()
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "DiagnosticFailure")

    [event] = failure_events(job)
    trace = event.fields["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    # The operation that raised is named, in its file, and the error ends it.
    assert re.search(r'File ".*diagnostics\.py", line \d+, in fail\n', trace), trace
    assert trace.rstrip().endswith("jobs.diagnostics.DiagnosticFailure: disk 7 is <full>")
    assert event.fields["fingerprint"] == fingerprint(
        "DiagnosticFailure", "disk 7 is <full>", "diagnostics.py:fail"
    )

    lines = [line for line in proc.output().splitlines() if f"job_id={job.pk}" in line]
    [line] = [line for line in lines if "job.failed" in line]
    assert " WARNING workers job.failed " in line
    assert "operation=fail" in line and "attempt=1" in line
    assert "error=DiagnosticFailure message='disk 7 is <full>'" in line


def test_each_retried_attempt_keeps_its_own_traceback(worker):
    job = enqueue("fail", {"message": "flaky\nupstream", "retryable": True}, max_attempts=2)
    proc = worker()
    wait_for(lambda: len(failure_events(job)) == 2, timeout=30, message="two failed attempts")
    retry, final = failure_events(job)
    assert (retry.event, final.event) == ("job.retry_scheduled", "job.failed")
    for event in (retry, final):
        assert "in fail\n" in event.fields["traceback"]
    # Same class, message and frame: the same failure, twice.
    assert retry.fields["fingerprint"] == final.fields["fingerprint"]
    wait_for(lambda: "job.failed job_id" in proc.output(), message="the failure's log line")
    out = proc.output()
    retry_line = next(line for line in out.splitlines() if "job.retry_scheduled job_id" in line)
    assert " WARNING " in retry_line and "attempt=1" in retry_line
    # The message's newline stays escaped: one failure, one log line.
    assert "message='flaky\\nupstream'" in retry_line
