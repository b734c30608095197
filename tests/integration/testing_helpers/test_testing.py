"""django_controlplane.testing: assertions on what was enqueued, draining it in the test,
and the run-at-once mode; each test runs inside pytest-django's ``db`` (TestCase's wrapping
transaction) and ``transactional_db``, on the database of the session (SQLite or PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import TestCase

from django_controlplane.testing import (
    TEST_WORKER_ID,
    assert_enqueued,
    drain_jobs,
    enqueued_jobs,
    refute_enqueued,
    run_jobs_at_once,
)
from jobs.clock import db_now
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent
from jobs.operations import operation

ECHO = "testing_helpers.echo"
PARENT = "testing_helpers.parent"


@operation(ECHO, payload_schema={"type": "object"})
def echo(ctx, payload):
    """Returns its payload, after one event of its own."""
    ctx.emit("echo.said", None, keys=sorted(payload))
    return {"echo": payload}


@operation(PARENT, payload_schema={"type": "object"})
def parent(ctx, payload):
    """Enqueues ``children`` echo jobs (children of this job) on ``child_queue``."""
    enqueue_many(
        [
            JobSpec(
                operation=ECHO,
                payload={"index": i},
                queue=payload.get("child_queue", "default"),
                parent=ctx.job_id,
            )
            for i in range(payload.get("children", 2))
        ]
    )
    return {"spawned": payload.get("children", 2)}


@pytest.fixture(
    params=[
        # pytest-django decides which databases to create from the tests' marks, so
        # each parameter carries its own mark (requesting ``db`` lazily would not do).
        pytest.param("db", marks=pytest.mark.django_db),
        pytest.param("transactional_db", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def database(request) -> str:
    """Every test twice: inside TestCase's transaction (``db``), and with real commits."""
    request.getfixturevalue(request.param)
    import tests.ops  # noqa: F401 - test.atomic, in this process

    return request.param


def timeline(job: Job) -> list[tuple[int, str]]:
    return list(JobEvent.objects.filter(job_id=job.pk).order_by("seq").values_list("seq", "event"))


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


# --- assert_enqueued / refute_enqueued -------------------------------------------------


def test_assert_enqueued_matches_operation_queue_and_a_nested_payload_subset(database):
    a = enqueue(ECHO, {"user": {"id": 7, "name": "ada"}, "n": 1}, queue="mail")
    enqueue(ECHO, {"user": {"id": 8}, "n": 1})
    enqueue("ping")

    assert assert_enqueued(ECHO, payload={"user": {"id": 7}}) == [fresh(a)]
    assert len(assert_enqueued(ECHO, payload={"n": 1}, count=2)) == 2
    assert assert_enqueued(queue="mail")[0].pk == a.pk
    assert len(assert_enqueued(count=3)) == 3
    assert len(enqueued_jobs(ECHO)) == 2
    refute_enqueued(ECHO, payload={"user": {"id": 9}})
    refute_enqueued(ECHO, queue="mail", payload={"user": {"name": "bob"}})
    refute_enqueued("ping", queue="mail")
    # A subset, not a prefix: a list must be equal, and a missing key does not match None.
    refute_enqueued(ECHO, payload={"user": None})


def test_a_failed_assertion_lists_what_was_enqueued(database):
    enqueue(ECHO, {"user": {"id": 8}}, queue="mail")
    enqueue("ping")

    with pytest.raises(AssertionError) as missing:
        assert_enqueued(ECHO, payload={"user": {"id": 7}})
    text = str(missing.value)
    assert "Expected at least one job with operation='testing_helpers.echo', payload" in text
    assert "found 0" in text
    assert "Enqueued jobs (2)" in text
    assert "testing_helpers.echo queue='mail' status=queued payload={'user': {'id': 8}}" in text
    assert "ping queue='default' status=queued payload={}" in text

    with pytest.raises(AssertionError, match=r"exactly 2 job\(s\) with operation='ping'"):
        assert_enqueued("ping", count=2)

    with pytest.raises(AssertionError) as present:
        refute_enqueued(queue="mail")
    assert "Expected no job with queue='mail'; found 1" in str(present.value)
    assert "Matching jobs (1)" in str(present.value)


# --- drain_jobs ----------------------------------------------------------------------


def test_drain_runs_a_job_through_the_worker_claim_and_completion(database):
    job = enqueue("ping")
    result = drain_jobs()

    assert [(r.operation, r.outcome, r.attempt) for r in result.runs] == [("ping", "succeeded", 1)]
    assert result.counts == {"succeeded": 1}
    assert not result.hit_limit
    done = fresh(job)
    assert (done.status, done.result, done.lease_token) == ("succeeded", {"pong": True}, None)
    events = timeline(job)
    assert [name for _, name in events] == ["job.started", "job.succeeded"]
    assert events[0][0] < events[1][0]
    started = JobEvent.objects.get(job_id=job.pk, event="job.started")
    assert started.fields["worker"] == str(TEST_WORKER_ID)
    assert result.jobs == [done]
    assert drain_jobs().runs == []  # nothing left


def test_events_an_operation_emits_land_between_started_and_succeeded(database):
    job = enqueue(ECHO, {"a": 1})
    drain_jobs()
    assert [name for _, name in timeline(job)] == ["job.started", "echo.said", "job.succeeded"]


def test_an_atomic_operation_emits_and_writes_in_the_tests_transaction(database):
    job = enqueue("test.atomic", {"queue_name": f"q-{uuid.uuid4().hex[:8]}"})
    result = drain_jobs()
    assert result.counts == {"succeeded": 1}
    assert [name for _, name in timeline(job)] == ["job.started", "atomic.wrote", "job.succeeded"]


def test_children_enqueued_by_a_job_run_in_the_same_drain(database):
    job = enqueue(PARENT, {"children": 2})
    result = drain_jobs()

    assert [r.operation for r in result.runs] == [PARENT, ECHO, ECHO]
    assert result.counts == {"succeeded": 3}
    children = assert_enqueued(ECHO, count=2)
    assert {c.parent_id for c in children} == {job.pk}
    assert sorted(c.result["echo"]["index"] for c in children) == [0, 1]


def test_only_the_named_queues_are_drained(database):
    a = enqueue("ping", queue="a")
    b = enqueue("ping", queue="b")
    result = drain_jobs(queues=["a"])
    assert result.job_ids == [a.pk]
    assert fresh(b).status == "queued"


def test_a_failing_job_ends_failed_with_the_workers_error_record(database):
    job = enqueue("fail", {"message": "boom"})
    result = drain_jobs()

    assert [r.outcome for r in result.runs] == ["failed"]
    assert result.counts == {"failed": 1}
    failed = fresh(job)
    assert (failed.error_code, failed.error_message) == ("DiagnosticFailure", "boom")
    assert [name for _, name in timeline(job)] == ["job.started", "job.failed"]


def test_a_retry_waits_for_its_backoff_unless_scheduled_jobs_are_included(database):
    job = enqueue("fail", {"message": "again", "retryable": True})  # max_attempts=3

    first = drain_jobs()
    assert [r.outcome for r in first.runs] == ["retry_scheduled"]
    waiting = fresh(job)
    assert waiting.status == "queued" and waiting.run_after > db_now()

    rest = drain_jobs(include_scheduled=True)
    assert [(r.attempt, r.outcome) for r in rest.runs] == [(2, "retry_scheduled"), (3, "failed")]
    assert rest.counts == {"failed": 1}
    names = [name for _, name in timeline(job)]
    assert names.count("job.started") == 3
    assert names.count("job.run_now") == 2
    assert names[-1] == "job.failed"


def test_retry_later_and_scheduled_jobs_run_with_include_scheduled(database):
    later = enqueue("retry_later", {"times": 2, "delay": 3600})
    scheduled = enqueue("ping", run_after=db_now() + timedelta(days=1))

    assert [r.outcome for r in drain_jobs().runs] == ["retry_later"]
    assert fresh(scheduled).status == "queued"

    result = drain_jobs(include_scheduled=True)
    assert fresh(later).result == {"retried": 2}
    assert result.counts == {"succeeded": 2}


def test_the_limit_stops_the_drain_and_says_so(database):
    for _ in range(3):
        enqueue("ping")
    first = drain_jobs(limit=2)
    assert (len(first.runs), first.hit_limit) == (2, True)
    second = drain_jobs(limit=2)
    assert (len(second.runs), second.hit_limit) == (1, False)


def test_batch_queues_are_drained_through_the_batch_runner(database):
    job = enqueue("fanout", {"batches": 3})
    result = drain_jobs()

    assert [r.outcome for r in result.runs] == ["deferred"]
    assert [m.queue for m in result.messages].count("default.batch") == 3
    assert [m.outcome for m in result.messages][-1] == "closed_parent"
    done = fresh(job)
    assert (done.status, done.progress_current, done.progress_total) == ("succeeded", 3, 3)


# --- run_jobs_at_once ----------------------------------------------------------------


def test_run_at_once_runs_each_job_and_its_children_inside_enqueue(database):
    with run_jobs_at_once() as result:
        job = enqueue(PARENT, {"children": 2, "child_queue": "kids"})
        # Already run when enqueue returned, children (on another queue) included.
        assert fresh(job).status == "succeeded"
        assert [c.status for c in assert_enqueued(ECHO, queue="kids", count=2)] == [
            "succeeded",
            "succeeded",
        ]
        scheduled = enqueue("ping", run_after=db_now() + timedelta(days=1))
        assert fresh(scheduled).status == "queued"
    assert result.counts == {"succeeded": 3}

    after = enqueue("ping")
    assert fresh(after).status == "queued"  # the mode ended with the block


def test_run_at_once_records_failures_as_a_worker_does(database):
    with run_jobs_at_once():
        job = enqueue("fail", {"message": "nope"})
    assert fresh(job).status == "failed"


def test_run_at_once_ends_with_its_block_even_when_the_block_raises(database):
    with pytest.raises(RuntimeError), run_jobs_at_once():
        enqueue("ping")
        raise RuntimeError("the test's own error")
    assert fresh(enqueue("ping")).status == "queued"


def test_run_at_once_runs_nothing_for_a_duplicate_of_a_held_unique_key(database):
    held = enqueue("ping", unique_key="only-one")
    with run_jobs_at_once() as result:
        again = enqueue("ping", unique_key="only-one", queue="other")
    assert again.duplicate and again.pk == held.pk
    assert result.runs == []
    assert fresh(held).status == "queued"


class DjangoTestCaseUse(TestCase):
    """The same helpers from a plain ``django.test.TestCase``, as a host's suite may be written."""

    def test_assert_drain_and_run_at_once(self):
        job = enqueue(PARENT, {"children": 1})
        assert_enqueued(PARENT, payload={"children": 1})
        result = drain_jobs()
        self.assertEqual(result.counts, {"succeeded": 2})
        self.assertEqual(fresh(job).status, "succeeded")
        with run_jobs_at_once():
            pinged = enqueue("ping")
        self.assertEqual(fresh(pinged).result, {"pong": True})


# --- outcome signals -------------------------------------------------------------------


def test_a_drain_sends_the_outcome_signals_a_worker_sends(
    database, django_capture_on_commit_callbacks
):
    from jobs.signals import job_failed, job_succeeded

    heard: list[tuple[str, uuid.UUID, str]] = []

    def succeeded(sender, outcome, **kwargs):
        heard.append(("succeeded", outcome.job_id, str(outcome.result)))

    def failed(sender, outcome, **kwargs):
        heard.append(("failed", outcome.job_id, outcome.error_code))

    job_succeeded.connect(succeeded, dispatch_uid="test-drain-succeeded")
    job_failed.connect(failed, dispatch_uid="test-drain-failed")
    try:
        good = enqueue(ECHO, {"n": 1})
        bad = enqueue("fail", {"message": "boom"})
        # Inside TestCase's transaction nothing commits: run what would run at commit.
        with django_capture_on_commit_callbacks(execute=True):
            drain_jobs()
    finally:
        job_succeeded.disconnect(dispatch_uid="test-drain-succeeded")
        job_failed.disconnect(dispatch_uid="test-drain-failed")
    assert sorted(heard) == sorted(
        [
            ("succeeded", good.pk, str({"echo": {"n": 1}})),
            ("failed", bad.pk, "DiagnosticFailure"),
        ]
    )
