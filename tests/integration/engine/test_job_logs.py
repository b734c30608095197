"""Job logs: a real worker captures what its operations log and print onto their timelines."""

from __future__ import annotations

import pytest

from jobs.conf import DEFAULTS
from jobs.enqueue import enqueue
from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED
from jobs.models import Job, JobEvent
from jobs.transitions import cancel_job
from tests.conftest import wait_for
from tests.factories import assert_consistent
from tests.integration.engine import log_ops

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = ",".join([*DEFAULTS["OPERATION_MODULES"], "tests.ops", log_ops.MODULE])


@pytest.fixture
def log_worker(start_process):
    def start(*, env: dict | None = None, burst: bool = False):
        args = ["runworker", "--queue", "default"] + (["--burst"] if burst else [])
        return start_process(
            *args,
            env={
                "CONTROLPLANE_OPERATION_MODULES": MODULES,
                "CONTROLPLANE_JOB_LOG_FLUSH_SECONDS": "0.2",
                **(env or {}),
            },
        )

    return start


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def logs(job: Job) -> list[JobEvent]:
    return list(
        JobEvent.objects.filter(job_id=job.pk, event__in=[JOB_LOG, JOB_LOG_TRUNCATED]).order_by(
            "seq"
        )
    )


def test_records_and_prints_of_the_job_thread_land_on_its_timeline_in_order(log_worker):
    job = enqueue("test.log_and_print", {"hold": 30})
    proc = log_worker()
    # Visible while the job still runs (the flusher's tick), not only at its end.
    wait_for(lambda: len(logs(job)) >= 6, timeout=20, message="logs while running")
    assert status(job) == "running", proc.output()
    cancel_job(job.pk)  # the run ends; its last (unfinished) line is written then
    wait_for(lambda: any(e.message.startswith("partial") for e in logs(job)), message="tail")
    records = logs(job)
    messages = [e.message.splitlines()[0] for e in records]
    assert messages == [
        "first: info",
        "second: printed",
        "third: warning with args",
        "fourth: on stderr",
        "fifth: error with traceback",
        "sixth: <script>alert('log')</script>",
        "partial line without newline",
    ]
    assert [e.level for e in records] == [
        "info",
        "info",
        "warning",
        "warning",
        "error",
        "info",
        "info",
    ]
    assert [e.fields["source"] for e in records] == [
        "logging",
        "stdout",
        "logging",
        "stderr",
        "logging",
        "stdout",
        "stdout",
    ]
    assert records[0].fields["logger"] == "tests.log_ops"
    assert records[4].fields["levelname"] == "ERROR"
    assert "ValueError: boom" in records[4].message  # the traceback goes with the record
    # Times: each record's own, in order, within the run.
    started = JobEvent.objects.get(job_id=job.pk, event="job.started").ts
    stamps = [e.ts for e in records]
    assert stamps == sorted(stamps)
    assert all(started <= ts for ts in stamps)
    assert "debug is below" not in str(messages)
    assert "from another thread" not in str(messages)  # other threads go on as before
    assert_consistent(job)
    # The worker's own output still has them (echo on), and the other thread's line.
    out = proc.output()
    assert "third: warning with args" in out
    assert "second: printed" in out
    assert "from another thread" in out


def test_logs_are_written_before_a_failure_is_stored(log_worker):
    job = enqueue("test.log_and_print", {"fail": True}, max_attempts=1)
    log_worker(burst=True).wait(timeout=60)
    assert status(job) == "failed"
    names = [e for _, e in assert_consistent(job)]
    assert names.index(JOB_LOG) < names.index("job.failed")
    assert len(logs(job)) == 7


def test_a_job_that_prints_10_mb_and_logs_100000_lines_is_bounded(log_worker):
    chatty = enqueue("test.chatty", {"print_bytes": 10_000_000, "log_lines": 100_000})
    after = enqueue("ping")
    proc = log_worker(env={"CONTROLPLANE_JOB_LOG_ECHO": "false"})
    wait_for(lambda: status(after) == "succeeded", timeout=120, message="the next job ran")
    assert status(chatty) == "succeeded"
    records = logs(chatty)
    kept = [e for e in records if e.event == JOB_LOG]
    markers = [e for e in records if e.event == JOB_LOG_TRUNCATED]
    assert len(kept) == DEFAULTS["JOB_LOG_MAX_RECORDS"]
    assert len(markers) == 1 and markers[0] is records[-1]
    marker = markers[0]
    # 100,000 printed lines and 100,000 logged lines, less what was kept.
    assert marker.fields["dropped_records"] == 200_000 - len(kept)
    # 90,000 printed lines of 99 bytes, 100,000 logged lines of 6 to 10.
    assert 90_000 * 99 < marker.fields["dropped_bytes"] < 90_000 * 99 + 100_000 * 11
    assert "Log truncated" in marker.message and marker.level == "warning"
    assert JobEvent.objects.filter(job_id=chatty.pk).count() < len(kept) + 10
    assert_consistent(chatty)
    assert proc.popen.poll() is None  # the worker serves on
    # Echo off: none of it reached the worker's output.
    assert "xxxxxxxxxx" not in proc.output() and "line 99999" not in proc.output()


def test_capture_off_writes_no_log_events(log_worker):
    job = enqueue("test.log_and_print", {})
    proc = log_worker(env={"CONTROLPLANE_JOB_LOG_CAPTURE": "false"}, burst=True)
    assert proc.wait(timeout=60) == 0, proc.output()
    assert status(job) == "succeeded"
    assert logs(job) == []
    assert "second: printed" in proc.output()


def test_a_job_that_logs_nothing_gets_no_log_events(log_worker):
    job = enqueue("ping")
    log_worker(burst=True).wait(timeout=60)
    assert [name for _, name in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        "job.succeeded",
    ]
