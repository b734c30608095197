"""Outcome signals from the status writes: once per outcome, after commit, none on rollback."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import signals, transitions
from jobs.rescues import fail_timed_out, requeue_expired_leases
from jobs.timeouts import fail_overdue_jobs
from tests import signal_app
from tests.factories import cancelled, fresh, queued, running

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard(tmp_path):
    """The recording receivers connected; returns ``kinds(job)``: what each job was sent."""
    path = tmp_path / "signals.jsonl"
    signal_app.install(path)

    def kinds(job) -> list[str]:
        return [e["kind"] for e in signal_app.read(path) if e.get("job_id") == str(job.pk)]

    kinds.entries = lambda job: [  # type: ignore[attr-defined]
        e for e in signal_app.read(path) if e.get("job_id") == str(job.pk)
    ]
    yield kinds
    signal_app.uninstall()


def test_cancel_sends_one_signal_per_job_and_descendant_after_commit(heard):
    parent = queued()
    child = queued(parent=parent.pk)
    other, _ = running()
    transitions.cancel_jobs([parent.pk, other.pk], by="ops", reason="no longer needed")
    assert heard(parent) == heard(child) == heard(other) == ["job_cancelled"]
    [entry] = heard.entries(other)
    assert (entry["status"], entry["by"], entry["stored"]) == ("cancelled", "ops", "cancelled")
    assert entry["in_atomic"] is False  # sent once the transaction committed
    transitions.cancel_jobs([parent.pk, other.pk])  # terminal already: nothing moves
    assert heard(parent) == heard(other) == ["job_cancelled"]


def test_a_rolled_back_change_sends_nothing(heard):
    job, held = running()
    other = queued()
    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.cancel_job(other.pk)
        transitions.fail_job(
            job.pk, lease_token=held.lease_token, error_code="Boom", error_message="x"
        )
        assert heard(job) == [] and heard(other) == []  # not before the commit
        raise RuntimeError("roll back")
    assert fresh(job).status == "running" and fresh(other).status == "queued"
    assert heard(job) == [] and heard(other) == []
    with transaction.atomic():
        transitions.cancel_job(other.pk)
        assert heard(other) == []
    assert heard(other) == ["job_cancelled"]


def test_each_way_back_to_queued_has_its_signal(heard):
    later, later_held = running()
    transitions.retry_job_later(
        later.pk, lease_token=later_held.lease_token, reason="busy", delay_seconds=60
    )
    requeued, requeued_held = running()
    transitions.requeue_job(requeued.pk, lease_token=requeued_held.lease_token, by="ops")
    retried = cancelled()
    transitions.retry_job(retried.pk, by="ops")
    assert heard(later) == ["job_retry_later"]
    assert heard(requeued) == ["job_requeued"]
    assert heard(retried) == ["job_cancelled", "job_retried"]
    [entry] = heard.entries(later)
    assert entry["attempt"] == 1 and entry["event"] == "job.retry_later"


def test_the_reaper_rescues_and_timeouts_send_their_outcomes(heard):
    expired, _ = running()
    over, _ = running(timeout_seconds=60)
    stalled, _ = running()
    long_ago = timezone.now() - timedelta(hours=1)
    type(stalled).objects.filter(pk__in=[over.pk, stalled.pk]).update(started_at=long_ago)
    gone = fresh(expired).worker_id  # its worker is gone: the reaper rescues its job
    requeued, failed = requeue_expired_leases(max_requeues=1, worker_ids=[gone])
    assert expired.pk in requeued and not failed
    assert fail_overdue_jobs() == [over.pk]
    assert fail_timed_out(timeout_seconds=600, stall_seconds=0) == [stalled.pk]
    assert heard(expired) == ["job_requeued"]
    assert heard(over) == ["job_failed"] and heard(stalled) == ["job_failed"]
    [entry] = heard.entries(over)
    assert (entry["event"], entry["error_code"]) == ("job.timeout", "JobTimeout")


def test_a_receiver_that_raises_leaves_the_outcome_and_the_others(tmp_path, caplog):
    path = tmp_path / "signals.jsonl"
    signal_app.install(path, raising=True)
    try:
        job = queued()
        assert transitions.cancel_jobs([job.pk]) == [job.pk]
    finally:
        signal_app.uninstall()
    assert fresh(job).status == "cancelled"
    assert [e["kind"] for e in signal_app.read(path)] == ["job_cancelled"]
    assert "signal.receiver_failed signal=job_cancelled" in caplog.text


def test_without_receivers_a_write_reads_nothing_more():
    """The outcome's columns are read only when someone hears them."""
    assert not signals.job_cancelled.receivers
    job = queued()
    with CaptureQueriesContext(connection) as plain:
        transitions.cancel_jobs([job.pk])
    assert not any("error_message" in q["sql"] for q in plain.captured_queries)
    received = []

    def receive(sender, **kwargs):
        received.append(kwargs["job_id"])

    signals.job_cancelled.connect(receive)
    try:
        other = queued()
        with CaptureQueriesContext(connection) as listened:
            transitions.cancel_jobs([other.pk])
    finally:
        signals.job_cancelled.disconnect(receive)
    assert received == [other.pk]
    assert len(listened.captured_queries) == len(plain.captured_queries)
    assert any("error_message" in q["sql"] for q in listened.captured_queries)
