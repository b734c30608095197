"""Per-job timeouts: the worker fails a run past ``timeout_seconds`` with
``JobTimeout``, frees its slot while the thread still runs, and nothing the thread
does later overwrites the failure; the reaper is the backstop; ``--processes``
replaces a child whose timed-out thread never looks.

Each job's ``timeout_seconds`` comes from enqueue or, when not given, its operation's.
"""

from __future__ import annotations

import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.detail import last_failure
from jobs.claims import Completion, claim_jobs, complete_jobs
from jobs.enqueue import enqueue
from jobs.exceptions import LeaseLost
from jobs.models import Job, JobEvent, Worker
from jobs.timeouts import fail_overdue_jobs, time_out_job
from jobs.transitions import complete_job, emit_event, fail_job
from tests.conftest import wait_for
from tests.factories import assert_consistent, unique_queue
from tests.integration.timelines import events_of

pytestmark = pytest.mark.django_db(transaction=True)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def events(job: Job) -> list[str]:
    return events_of(job)


def timeout_event(job: Job) -> JobEvent:
    return JobEvent.objects.get(job_id=job.pk, event="job.timeout")


def stubborn(tmp_path: Path, name: str, release: Path, **options) -> tuple[Job, Path]:
    """A job whose operation ignores its context until ``release`` exists."""
    marker = tmp_path / f"{name}.returned"
    job = enqueue(
        "test.stubborn_sleep", {"release": str(release), "marker": str(marker)}, **options
    )
    return job, marker


# --- the worker ------------------------------------------------------------------------


def test_a_timeout_fails_a_stuck_job_and_frees_its_slot(worker, tmp_path):
    release = tmp_path / "release"
    stuck, returned = stubborn(tmp_path, "stuck", release, priority=10, timeout_seconds=1)
    after = enqueue("ping", {})  # claimed once the stuck job's slot is free
    proc = worker(args=("--concurrency", "1"))

    wait_for(lambda: status(stuck) == "failed", timeout=15, message="the stuck job to time out")
    row = fresh(stuck)
    assert row.error_code == "JobTimeout" and "timeout of 1 s" in row.error_message
    assert row.lease_token is None
    ran = (row.finished_at - row.started_at).total_seconds()
    assert 1.0 <= ran < 5.0, ran
    event = timeout_event(stuck)
    assert event.level == "error"
    assert event.fields["error_code"] == "JobTimeout" and event.fields["by"] == "worker"
    assert event.fields["timeout_seconds"] == 1.0
    # Where the thread stood at the deadline: inside the operation, shown on the job's page.
    assert "stubborn_sleep" in event.fields["traceback"] and event.fields["fingerprint"]
    assert "stubborn_sleep" in last_failure(row).traceback

    # The concurrency-1 worker runs the next job while the first thread still runs.
    wait_for(lambda: status(after) == "succeeded", timeout=10, message="the next job to run")
    assert not returned.exists(), "the stuck thread ended: the test proves nothing"
    assert fresh(after).started_at >= row.finished_at

    # The abandoned thread returns a result at last: it changes nothing.
    release.touch()
    wait_for(returned.exists, message="the stuck thread to return")
    wait_for(
        lambda: f"job.stopped job_id={stuck.pk}" in proc.output(),
        message="the worker to drop the late result",
    )
    assert "reason=timeout" in proc.output().split(f"job.stopped job_id={stuck.pk}")[1][:400]
    row = fresh(stuck)
    assert (row.status, row.error_code, row.result) == ("failed", "JobTimeout", None)
    assert events(stuck) == ["job.enqueued", "job.started", "job.timeout"]
    assert_consistent(stuck)
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()


def test_a_cooperative_operation_sees_its_timeout_as_a_cancel(worker, tmp_path):
    marker = tmp_path / "saw"
    # The operation declares timeout_seconds=0.5: every job of it gets it unless told otherwise.
    job = enqueue("test.cooperative_sleep", {"seconds": 30, "marker": str(marker)})
    assert fresh(job).timeout_seconds == 0.5
    proc = worker()
    wait_for(lambda: status(job) == "failed", timeout=15, message="the job to time out")
    wait_for(marker.exists, message="the operation to notice")
    # ``ctx.cancelled`` turned true, ``wait_cancelled`` returned, ``emit`` refused.
    assert marker.read_text() == "cancelled=True emit=JobCancelled"
    wait_for(lambda: f"job.stopped job_id={job.pk}" in proc.output(), message="the run to end")
    assert events(job) == ["job.enqueued", "job.started", "job.timeout"]
    assert fresh(job).error_code == "JobTimeout"
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()


def test_a_worker_abandons_at_most_its_concurrency_then_the_slot_waits(worker, tmp_path):
    release = tmp_path / "release"
    first, first_returned = stubborn(tmp_path, "first", release, priority=10, timeout_seconds=0.5)
    second, _ = stubborn(tmp_path, "second", release, priority=5, timeout_seconds=0.5)
    last = enqueue("ping", {})
    proc = worker(args=("--concurrency", "1"))
    wait_for(
        lambda: status(first) == status(second) == "failed",
        timeout=15,
        message="both stuck jobs to time out",
    )
    # One abandoned thread is this worker's bound: the second keeps its slot.
    wait_for(lambda: "job.timeout_slot_kept" in proc.output(), message="the slot to be kept")
    deadline = time.monotonic() + 0.6  # three polls: the worker would have claimed by now
    while time.monotonic() < deadline:
        assert status(last) == "queued"
        time.sleep(0.05)
    assert not first_returned.exists()
    release.touch()
    wait_for(lambda: status(last) == "succeeded", timeout=10, message="the slot to come back")
    assert fresh(first).error_code == fresh(second).error_code == "JobTimeout"
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()


def test_a_late_outcome_never_overwrites_a_timeout():
    job = enqueue("ping", {}, queue=unique_queue(), timeout_seconds=5)
    [held] = claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert held.timeout_seconds == 5.0
    time_out_job(job.pk, lease_token=held.lease_token, timeout_seconds=5)
    for late in (
        lambda: complete_job(job.pk, lease_token=held.lease_token, result={"late": True}),
        lambda: fail_job(
            job.pk, lease_token=held.lease_token, error_code="Late", error_message="late"
        ),
        lambda: emit_event(job.pk, event="late.tick", lease_token=held.lease_token),
        lambda: time_out_job(job.pk, lease_token=held.lease_token, timeout_seconds=5),
    ):
        with pytest.raises(LeaseLost):
            late()
    # The batched success path drops it too.
    assert complete_jobs([Completion(job.pk, held.lease_token, result={"late": True})]) == []
    row = fresh(job)
    assert (row.status, row.error_code, row.result) == ("failed", "JobTimeout", None)
    assert events(job) == ["job.enqueued", "job.started", "job.timeout"]
    assert_consistent(job)


# --- the reaper's backstop ---------------------------------------------------------------


def claimed_by_a_gone_worker(timeout: float | None) -> Job:
    """A running job whose worker will never act on it (its lease stays valid for 5 minutes)."""
    job = enqueue("ping", {}, queue=unique_queue(), timeout_seconds=timeout)
    assert claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=300)
    return job


def test_the_reaper_fails_an_overdue_job_whose_worker_did_not_act(start_process):
    overdue = claimed_by_a_gone_worker(0.5)
    untimed = claimed_by_a_gone_worker(None)
    patient = claimed_by_a_gone_worker(600)
    reaper = start_process(
        "reaper", "--interval", "0.2", env={"CONTROLPLANE_TIMEOUT_GRACE_SECONDS": "0.5"}
    )
    wait_for(lambda: status(overdue) == "failed", timeout=15, message="the reaper to act")
    row = fresh(overdue)
    assert row.error_code == "JobTimeout" and row.lease_token is None
    assert (row.finished_at - row.started_at).total_seconds() >= 1.0  # timeout + grace
    assert timeout_event(overdue).fields["by"] == "reaper"
    assert events(overdue) == ["job.enqueued", "job.started", "job.timeout"]
    assert status(untimed) == status(patient) == "running"
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0


def test_fail_overdue_jobs_waits_for_the_grace_and_fences_held_jobs():
    job = enqueue("ping", {}, queue=unique_queue(), timeout_seconds=0.2)
    [held] = claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=300)
    assert fail_overdue_jobs(grace_seconds=0) == []  # not yet past its deadline
    wait_for(
        lambda: timezone.now() - fresh(job).started_at > timedelta(seconds=0.3),
        message="the deadline to pass",
    )
    assert fail_overdue_jobs(grace_seconds=60) == []  # past it, but within the grace
    # A heartbeat names its jobs with their tokens: a stale token touches nothing.
    assert fail_overdue_jobs(held=[(job.pk, uuid.uuid4())]) == []
    assert fail_overdue_jobs(held=[(job.pk, held.lease_token)], by="heartbeat") == [job.pk]
    assert fail_overdue_jobs() == []  # never twice
    assert timeout_event(job).fields["by"] == "heartbeat"
    assert status(job) == "failed"


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_the_reaper_s_scan_reads_running_rows_through_a_partial_index():
    with CaptureQueriesContext(connection) as queries:
        fail_overdue_jobs(grace_seconds=10)
    [scan] = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # can an index serve it at all?
        cursor.execute("EXPLAIN " + scan)
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "Seq Scan on controlplane_job" not in plan, plan
    # Which index depends on the table's statistics; each reads running rows only.
    running_indexes = ("job_running_lease_idx", "job_worker_idx", "job_queue_status_idx")
    assert any(name in plan for name in running_indexes), plan


# --- runworker --processes ----------------------------------------------------------------


def test_the_supervisor_replaces_a_child_whose_timed_out_thread_never_looks(worker, tmp_path):
    stuck, returned = stubborn(tmp_path, "stuck", tmp_path / "never", timeout_seconds=0.5)
    proc = worker(args=("--processes", "2"), env={"CONTROLPLANE_TIMEOUT_KILL_GRACE_SECONDS": "0.5"})
    wait_for(lambda: status(stuck) == "failed", timeout=15, message="the stuck job to time out")
    holder = str(fresh(stuck).worker_id)
    wait_for(
        lambda: "worker.child_restarted" in proc.output(),
        timeout=20,
        message="the supervisor to replace the child",
    )
    out = proc.output()
    assert f"worker.child_stopped id={holder}" in out and "reason=timeout" in out
    assert "worker.child_died" not in out  # a stop, not a crash
    # The replacement serves; the stuck thread died with its process.
    wait_for(
        lambda: Worker.objects.count() == 2 and not Worker.objects.filter(pk=holder).exists(),
        message="a replacement child",
    )
    after = enqueue("ping", {})
    wait_for(lambda: status(after) == "succeeded", timeout=10, message="the pool to serve")
    assert not returned.exists()
    assert fresh(stuck).error_code == "JobTimeout"
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()
