"""``timeout_seconds`` on operations, and the remote client's job at its deadline."""

from __future__ import annotations

import time

import pytest
from controlplane_client.api import JobCancelledError
from controlplane_client.jobs import ClaimedJob

from jobs.operations import Operation, OperationRegistry, operation


def test_the_decorator_and_the_class_declare_a_timeout():
    registry = OperationRegistry()

    @operation("slow", timeout_seconds=2.5, target=registry)
    def slow(ctx, payload):
        return None

    @operation("plain", target=registry)
    def plain(ctx, payload):
        return None

    class Big(Operation):
        name = "big"
        timeout_seconds = 60

    registry.register(Big)
    assert registry.get("slow").timeout_seconds == 2.5
    assert registry.get("plain").timeout_seconds is None
    assert registry.get("big").timeout_seconds == 60


@pytest.mark.parametrize("bad", [0, -1, "5", True, float("nan")])
def test_a_timeout_that_is_not_a_positive_number_is_refused_at_registration(bad):
    with pytest.raises(ValueError, match="timeout_seconds"):
        operation("bad", timeout_seconds=bad, target=OperationRegistry())(lambda ctx, p: None)


def claimed(timeout: float | None) -> ClaimedJob:
    return ClaimedJob.from_json(
        {
            "id": "j1",
            "operation": "op",
            "payload": {},
            "lease_token": "t1",
            "timeout_seconds": timeout,
        }
    )


def test_a_remote_job_reports_cancelled_once_its_timeout_has_passed():
    job = claimed(0.2)
    assert not job.cancelled and job.lost_reason is None
    job.raise_if_cancelled()
    started = time.monotonic()
    assert job.wait_cancelled(30) is True  # wakes at the deadline, not after 30 s
    assert 0.1 < time.monotonic() - started < 5
    assert job.cancelled and job.timed_out and job.lost_reason == "timed_out"
    with pytest.raises(JobCancelledError, match="timeout"):
        job.raise_if_cancelled()


def test_a_remote_job_without_a_timeout_never_times_out():
    job = claimed(None)
    assert job.wait_cancelled(0.05) is False
    assert not job.cancelled and not job.timed_out
