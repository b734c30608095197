"""The Python client sends the traceback of an operation that raised (real client, real server)."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.failures import fingerprint
from jobs.models import JobEvent
from tests.conftest import wait_for

from .helpers import job_status

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_raising_operation_reports_its_traceback(start_client, server):
    client = start_client("--mode", "auto")
    client.wait_output("READY ")
    broken = enqueue("remote.broken", {})
    odd = enqueue("remote.broken", {"unserialisable": True})
    for job in (broken, odd):
        wait_for(lambda job=job: job_status(job.pk) == "failed", message="the job to fail")
    fields = JobEvent.objects.get(job_id=broken.pk, event="job.failed").fields
    trace = fields["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    assert 'client_app.py", line' in trace and ", in broken\n" in trace
    assert trace.rstrip().endswith("ValueError: broken on purpose")
    assert fields["fingerprint"] == fingerprint(
        "ValueError", "broken on purpose", "client_app.py:broken"
    )
    # A failure the client reports itself, with no exception raised, sends none.
    odd_fields = JobEvent.objects.get(job_id=odd.pk, event="job.failed").fields
    assert odd_fields["error_code"] == "InvalidResult" and "traceback" not in odd_fields
