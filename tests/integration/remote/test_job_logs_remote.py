"""A remote operation's log through the real client: ``job.log`` and captured ``logging``."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED
from jobs.models import JobEvent
from tests.conftest import wait_for
from tests.factories import assert_consistent

from .helpers import job_status

pytestmark = pytest.mark.django_db(transaction=True)


def logs(job_id) -> list[JobEvent]:
    return list(
        JobEvent.objects.filter(job_id=job_id, event__in=[JOB_LOG, JOB_LOG_TRUNCATED]).order_by(
            "seq"
        )
    )


def test_remote_operation_logs_reach_the_timeline_before_its_outcome(start_client, server):
    client = start_client("--mode", "auto", "--capture-logs")
    client.wait_output("READY ")
    job = enqueue("remote.logs", {"tag": "<i>"})
    wait_for(lambda: job_status(job.pk) == "succeeded", message="the job to succeed")
    records = logs(job.pk)
    assert [(e.level, e.message, e.fields["logger"]) for e in records] == [
        ("info", "via logging <b><i></b>", "remote.ops"),
        ("warning", "a warning", "remote.ops"),
        ("error", "via job.log", ""),
    ]
    assert {e.fields["source"] for e in records} == {"remote"}
    names = [name for _, name in assert_consistent(job.pk)]
    assert names.index("job.succeeded") == len(names) - 1  # logs first, then the outcome
    # The client's own HTTP lines are never a job's records.
    assert not any("HTTP Request" in e.message for e in records)


def test_a_chatty_remote_operation_is_bounded(start_client, server):
    client = start_client("--mode", "auto")
    client.wait_output("READY ")
    job = enqueue("remote.logs", {"lines": 12_000})
    wait_for(lambda: job_status(job.pk) == "succeeded", timeout=60, message="the job")
    records = logs(job.pk)
    kept = [e for e in records if e.event == JOB_LOG]
    [marker] = [e for e in records if e.event == JOB_LOG_TRUNCATED]
    assert marker.seq == records[-1].seq
    assert 0 < len(kept) <= 10_000
    # Everything the operation logged is either stored or counted as dropped.
    assert len(kept) + marker.fields["dropped_records"] == 12_001
    assert_consistent(job.pk)
