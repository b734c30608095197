"""A poison operation hurts only its own job (CONTRACT.md).

Each case runs in a real ``runworker`` process beside healthy jobs: the poison
job ends ``failed`` with a reason naming the cause (or, for the documented
conversions and clamps, stored as documented), the healthy jobs of the same
batch succeed, and the same worker process goes on serving: no crash, no
restart, no slot lost.
"""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from tests.conftest import wait_for
from tests.ops import POISON_BIG

pytestmark = pytest.mark.django_db(transaction=True)

TERMINAL = ("succeeded", "failed", "cancelled")


def _run_beside_healthy_jobs(worker, kind: str) -> Job:
    """The poison job in one claim with healthy ones; then one more job, same process."""
    proc = worker(args=("--concurrency", "4"))
    wait_for(lambda: "worker.started" in proc.output(), message="the worker to start")
    poison = enqueue("test.poison", {"kind": kind}, max_attempts=1, priority=1)
    healthy = [enqueue("ping", {}) for _ in range(5)]

    def settled() -> bool:
        assert proc.popen.poll() is None, f"the worker died:\n{proc.output()[-3000:]}"
        done = Job.objects.filter(pk__in=[poison.pk, *(j.pk for j in healthy)], status__in=TERMINAL)
        return done.count() == 6

    wait_for(settled, timeout=30, message=f"the {kind} job and its neighbours to finish")
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in healthy]).values_list("status", flat=True)
    ) == {"succeeded"}
    later = enqueue("ping", {})
    wait_for(
        lambda: Job.objects.get(pk=later.pk).status == "succeeded",
        timeout=20,
        message="a job enqueued after the poison job to succeed",
    )
    assert proc.popen.poll() is None, proc.output()[-3000:]
    assert proc.output().count("worker.started") == 1  # the same process, never restarted
    poison.refresh_from_db()
    return poison


@pytest.mark.parametrize(
    ("kind", "code", "named"),
    [
        ("progress_nan", "InvalidProgress", "nan"),
        ("progress_huge", "InvalidProgress", "1000000000000"),
        ("ctx_progress_negative", "InvalidProgress", "-5"),
        ("system_exit", "SystemExit", "SystemExit(3)"),
        ("keyboard_interrupt", "KeyboardInterrupt", "KeyboardInterrupt"),
        ("object", "ResultNotSerializable", "object"),
        ("set", "ResultNotSerializable", "set"),
        ("big_result", "ResultTooLarge", "MAX_RESULT_BYTES"),
        ("big_event", "EventMessageTooLong", "MAX_EVENT_MESSAGE_CHARS"),
    ],
)
def test_a_poison_job_fails_with_its_cause_and_the_worker_serves_on(worker, kind, code, named):
    job = _run_beside_healthy_jobs(worker, kind)
    assert (job.status, job.error_code) == ("failed", code), job.error_message[:500]
    assert named in job.error_message, job.error_message[:500]
    assert job.result is None


def test_an_oversized_error_message_is_cut_with_a_marker(worker):
    job = _run_beside_healthy_jobs(worker, "big_error")
    assert (job.status, job.error_code) == ("failed", "RuntimeError")
    assert len(job.error_message) < 10_200
    assert job.error_message.endswith(
        f"… [truncated: {POISON_BIG - 10_000} of {POISON_BIG} characters not stored]"
    )
    event = JobEvent.objects.get(job_id=job.pk, event="job.failed")
    assert event.message == job.error_message
    assert event.fields["error_message"] == job.error_message


def test_progress_above_its_total_is_clamped(worker):
    job = _run_beside_healthy_jobs(worker, "progress_over_total")
    assert job.status == "succeeded"
    assert (job.progress_current, job.progress_total) == (10, 10)


def test_documented_types_are_converted_and_nothing_else_is(worker):
    job = _run_beside_healthy_jobs(worker, "documented")
    assert job.status == "succeeded", job.error_message
    assert job.result == {
        "when": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "id": "00000000-0000-0000-0000-000000000007",
        "amount": "12.50",
    }
