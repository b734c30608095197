"""Poison values reported by remote workers, and the batched writes' containment.

Remote workers' ``complete``/``fail``/events get the local worker's caps: a
result past ``MAX_RESULT_BYTES`` or an event message past
``MAX_EVENT_MESSAGE_CHARS`` is a 400 (``RemoteRequestError``) and the job
stays running; error messages are cut with a marker; progress out of range
is refused. A batched success the database still refuses is written
one by one, failing only the job that holds the bad value.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model

from django_controlplane import remote
from django_controlplane.remote import RemoteRequestError
from jobs.claims import Completion, claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Worker

pytestmark = pytest.mark.django_db(transaction=True)

OP = {"name": "poison.remote", "queue": "remote"}


@pytest.fixture
def held(settings):
    """A job of a remote worker, claimed: (job id, lease token, user)."""
    settings.CONTROLPLANE = {**getattr(settings, "CONTROLPLANE", {}), "MAX_RESULT_BYTES": 1000}
    user = get_user_model().objects.create_user("robo", password="x")
    worker = remote.register_worker(user=user, operations=[OP])
    job = enqueue("poison.remote", {})
    [claimed] = remote.claim(worker_id=worker.pk, user=user).jobs
    assert claimed.id == job.pk
    return job.pk, str(claimed.lease_token), user


def test_a_remote_result_past_the_cap_is_refused_and_the_job_stays_running(held):
    job_id, token, user = held
    with pytest.raises(RemoteRequestError) as refused:
        remote.complete(job_id=job_id, lease_token=token, result={"blob": "x" * 2000}, user=user)
    assert "MAX_RESULT_BYTES" in refused.value.errors["result"][0]
    assert Job.objects.get(pk=job_id).status == "running"
    remote.complete(job_id=job_id, lease_token=token, result={"ok": True}, user=user)
    assert Job.objects.get(pk=job_id).status == "succeeded"


def test_a_remote_error_message_is_cut_with_a_marker(held):
    job_id, token, user = held
    remote.fail(
        job_id=job_id, lease_token=token, error_code="Boom", error_message="e" * 50_000, user=user
    )
    job = Job.objects.get(pk=job_id)
    assert job.status == "failed"
    assert job.error_message.endswith("… [truncated: 40000 of 50000 characters not stored]")


def test_a_remote_event_message_past_the_cap_is_refused_and_nothing_is_written(held):
    job_id, token, user = held
    with pytest.raises(RemoteRequestError) as refused:
        remote.post_event(
            job_id=job_id, lease_token=token, event="step", message="m" * 50_000, user=user
        )
    assert "MAX_EVENT_MESSAGE_CHARS" in refused.value.errors["message"][0]
    assert not JobEvent.objects.filter(job_id=job_id, event="step").exists()
    assert Job.objects.get(pk=job_id).status == "running"


def test_remote_event_fields_past_the_cap_are_refused(held):
    job_id, token, user = held
    with pytest.raises(RemoteRequestError) as refused:
        remote.post_event(
            job_id=job_id, lease_token=token, event="step", fields={"b": "x" * 2000}, user=user
        )
    assert "MAX_RESULT_BYTES" in refused.value.errors["fields"][0]
    assert not JobEvent.objects.filter(job_id=job_id, event="step").exists()


def test_remote_progress_out_of_range_is_refused(held):
    job_id, token, user = held
    for bad in (-5, 10**12, 1.5, float("nan")):
        with pytest.raises(RemoteRequestError):
            remote.post_event(
                job_id=job_id,
                lease_token=token,
                event="job.progress.step",
                fields={"_progress_current": bad},
                user=user,
            )
    assert Job.objects.get(pk=job_id).progress_current == 0


def test_a_batch_the_database_refuses_is_written_one_by_one(transactional_db):
    """Values that got past the per-job checks still fail only their own job.

    PostgreSQL: SQLite stores a 64-bit integer in any integer column.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's integer columns hold 10**12")
    from workers.config import WorkerConfig
    from workers.engine import JobWorker

    worker_id = uuid.uuid4()
    Worker.objects.create(pk=worker_id, name="w", queues=["default"])
    jobs = [enqueue("ping", {}) for _ in range(3)]
    claimed = {
        c.id: c
        for c in claim_jobs(queues=["default"], worker_id=worker_id, limit=3, lease_seconds=60)
    }
    good, bad, other = (claimed[j.pk] for j in jobs)
    engine = JobWorker(WorkerConfig(queues=("default",), worker_id=str(worker_id)))
    batch = [
        Completion(good.id, good.lease_token, {"ok": 1}, None, 1),
        Completion(bad.id, bad.lease_token, {"ok": 2}, (10**12, None), 1),  # out of int4
        Completion(other.id, other.lease_token, {"ok": 3}, None, 1),
    ]
    engine._completions = list(batch)
    engine._flush_completions()
    statuses = dict(Job.objects.filter(pk__in=claimed).values_list("id", "status"))
    assert statuses == {good.id: "succeeded", bad.id: "failed", other.id: "succeeded"}
    failed = Job.objects.get(pk=bad.id)
    assert failed.error_code == "ResultNotStorable"
    assert "1000000000000" in failed.error_message or "range" in failed.error_message
    assert engine._completions == []
