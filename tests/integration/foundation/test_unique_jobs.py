"""Unique jobs: ``unique_key`` with ``unique_while``, and ``idempotency_key`` as its older name.

Each mode's window, the duplicate flag, a new job once the window has
passed, requeues and retries against the index, concurrent enqueues of one
key, and ``timeout_seconds`` on enqueue. PostgreSQL and SQLite.
"""

from __future__ import annotations

import math
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import jobs.enqueue as enqueue_module
from django_controlplane.testing import drain_jobs
from jobs.enqueue import MAX_TIMEOUT_SECONDS, JobSpec, enqueue, enqueue_many
from jobs.exceptions import EnqueueError, IllegalTransition
from jobs.models import Job, JobEvent
from jobs.operations import Operation, registry
from jobs.rescues import requeue_expired_leases
from jobs.transitions import (
    complete_job,
    fail_job,
    requeue_job,
    retry_job,
    retry_job_later,
    retry_jobs,
)
from jobs.uniqueness import UniqueKeyHeld
from tests.factories import claim, fresh, refused, timeline, unique_queue
from workers.reaper import delete_finished_jobs

pytestmark = pytest.mark.django_db


def keyed(key: str, mode: str | None = None, **options) -> Job:
    """A ping job on a queue of its own (so a claim picks it), with ``key`` in ``mode``."""
    options.setdefault("queue", unique_queue())
    return enqueue("ping", {}, unique_key=key, unique_while=mode, **options)


def holders(key: str) -> list[Job]:
    return list(Job.objects.filter(unique_key=key).order_by("created_at", "id"))


def finish(job: Job) -> None:
    """Run ``job`` (alone in its queue) to success, as a worker runs it."""
    result = drain_jobs(queues=[job.queue])
    assert (result.job_ids, result.counts) == ([job.pk], {"succeeded": 1})


# --- each mode's window -------------------------------------------------------------------


def test_active_holds_the_key_while_queued_or_running():
    first = keyed("report-7", "active")
    assert first.duplicate is False
    again = keyed("report-7", "active")
    assert again.duplicate is True and again.pk == first.pk
    held = claim(first)
    assert keyed("report-7", "active").pk == first.pk  # running still holds it
    complete_job(first.pk, lease_token=held.lease_token, result=None)
    later = keyed("report-7", "active")
    assert later.duplicate is False and later.pk != first.pk
    assert [j.pk for j in holders("report-7")] == [first.pk, later.pk]
    assert timeline(first)[0] == (1, "job.enqueued") and len(timeline(later)) == 1


def test_a_key_alone_is_held_while_active():
    job = enqueue("ping", unique_key="plain")
    assert fresh(job).unique_while == "active"
    assert job.unique_while == "active" and job.idempotency_key is None


def test_queued_holds_the_key_until_the_job_first_starts():
    first = keyed("refresh", "queued")
    assert keyed("refresh", "queued").pk == first.pk
    claim(first)
    second = keyed("refresh", "queued")  # the first is running: a new one may wait
    assert second.duplicate is False and second.pk != first.pk
    third = keyed("refresh", "queued")
    assert third.duplicate is True and third.pk == second.pk
    assert len(holders("refresh")) == 2


def test_until_retention_holds_the_key_until_the_row_is_deleted():
    first = keyed("invoice-1", "until_retention")
    finish(first)
    again = keyed("invoice-1", "until_retention")
    assert again.duplicate is True and again.pk == first.pk
    assert again.status == "succeeded"
    assert delete_finished_jobs(timezone.now() + timedelta(seconds=1), 100) >= 1
    fresh_one = keyed("invoice-1", "until_retention")
    assert fresh_one.duplicate is False and fresh_one.pk != first.pk


def test_keys_are_one_namespace_and_the_holders_mode_decides():
    kept = keyed("shared", "until_retention")
    finish(kept)
    # An active-mode enqueue of the same key meets the finished holder.
    assert keyed("shared", "active").pk == kept.pk
    assert keyed("shared", "queued").pk == kept.pk
    assert len(holders("shared")) == 1


def test_a_duplicate_stores_nothing_and_returns_the_holder_as_stored():
    first = enqueue("sleep", {"seconds": 1}, unique_key="k", priority=3)
    before = (Job.objects.count(), JobEvent.objects.count())
    again = enqueue("sleep", {"seconds": 2}, unique_key="k", priority=9)
    assert (again.pk, again.payload, again.priority) == (first.pk, {"seconds": 1}, 3)
    assert (Job.objects.count(), JobEvent.objects.count()) == before


def test_enqueue_many_marks_each_duplicate():
    existing = enqueue("ping", unique_key="a")
    got = enqueue_many(
        [
            JobSpec("ping", unique_key="a"),
            JobSpec("ping", unique_key="b", unique_while="queued"),
            JobSpec("ping"),
            JobSpec("ping", unique_key="b", unique_while="queued"),
            JobSpec("ping", idempotency_key="c"),
        ]
    )
    assert [j.duplicate for j in got] == [True, False, False, True, False]
    assert got[0].pk == existing.pk and got[3].pk == got[1].pk
    assert Job.objects.count() == 4
    assert fresh(got[4]).unique_while == "until_retention"


# --- idempotency_key, the older name ------------------------------------------------------


def test_idempotency_key_is_a_key_held_until_retention():
    job = enqueue("ping", idempotency_key="order-9")
    row = fresh(job)
    assert (row.unique_key, row.unique_while, row.idempotency_key) == (
        "order-9",
        "until_retention",
        "order-9",
    )
    finish(job)
    assert enqueue("ping", unique_key="order-9", unique_while="until_retention").pk == job.pk
    assert enqueue("ping", idempotency_key="order-9").duplicate is True
    assert enqueue("ping", idempotency_key="x", unique_while="until_retention").unique_key == "x"


@pytest.mark.parametrize(
    "options,field",
    [
        ({"idempotency_key": "a", "unique_key": "a"}, "idempotency_key"),
        ({"idempotency_key": "a", "unique_while": "active"}, "unique_while"),
        ({"unique_while": "active"}, "unique_while"),
        ({"unique_key": "a", "unique_while": "forever"}, "unique_while"),
        ({"unique_key": ""}, "unique_key"),
        ({"unique_key": "k" * 256}, "unique_key"),
        ({"unique_key": 5}, "unique_key"),
        ({"unique_key": "k\x00"}, "unique_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
    ],
)
def test_bad_keys_and_modes_are_refused(options, field):
    before = Job.objects.count()
    with pytest.raises(EnqueueError) as info:
        enqueue("ping", {}, **options)
    assert field in info.value.errors, info.value.errors
    assert Job.objects.count() == before


# --- requeues and retries against the index ---------------------------------------------


def _shutdown(job, held):
    requeue_job(job.pk, lease_token=held.lease_token)


def _retry_later(job, held):
    retry_job_later(job.pk, lease_token=held.lease_token, reason="busy", delay_seconds=0)


def _backoff(job, held):
    fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="Flaky",
        error_message="again",
        retryable=True,
        backoff_seconds=0,
    )


def _lease_expiry(job, held):
    assert job.pk in requeue_expired_leases(max_requeues=5)[0]  # claimed with a spent lease


REQUEUES = [_shutdown, _retry_later, _backoff, _lease_expiry]


@pytest.mark.parametrize("requeue", REQUEUES, ids=lambda f: f.__name__.strip("_"))
def test_a_queued_mode_job_that_ran_goes_back_beside_the_new_holder(requeue):
    """The rule: once started, a ``queued``-mode job never takes its key again."""
    first = keyed("sync", "queued", max_attempts=3)
    held = claim(first, lease_seconds=-1)
    second = keyed("sync", "queued", queue=first.queue)
    assert second.duplicate is False
    requeue(first, held)  # no IntegrityError: the first does not hold the key any more
    row = fresh(first)
    assert row.status == "queued" and row.started_at is not None
    assert keyed("sync", "queued").pk == second.pk  # the new job still holds it
    assert {j.status for j in holders("sync")} == {"queued"}


@pytest.mark.parametrize("requeue", REQUEUES, ids=lambda f: f.__name__.strip("_"))
def test_an_active_job_requeued_keeps_its_key(requeue):
    job = keyed("nightly", "active", max_attempts=3)
    requeue(job, claim(job, lease_seconds=-1))
    assert fresh(job).status == "queued"
    assert keyed("nightly", "active").pk == job.pk


def test_requeues_of_jobs_without_a_queued_key_still_clear_started_at():
    for job in (keyed("k-active", "active"), enqueue("ping", queue=unique_queue())):
        _shutdown(job, claim(job))
        assert fresh(job).started_at is None


def _failed(key: str, mode: str) -> Job:
    job = keyed(key, mode)
    held = claim(job)
    fail_job(job.pk, lease_token=held.lease_token, error_code="Boom", error_message="boom")
    return job


@pytest.mark.parametrize("mode", ["active", "queued"])
def test_an_operator_retry_is_refused_while_another_job_holds_the_key(mode):
    old = _failed("export", mode)
    holder = keyed("export", mode)
    error = refused(old, lambda: retry_job(old.pk, by="alice"), UniqueKeyHeld)
    assert isinstance(error, IllegalTransition)  # 409 in the API, refused in the dashboard
    assert str(holder.pk) in str(error) and "'export'" in str(error)
    finish(holder)
    retry_job(old.pk, by="alice")
    assert fresh(old).status == "queued"
    assert keyed("export", mode).pk == old.pk  # the retried job holds the key again


def test_an_operator_retry_of_an_until_retention_job_is_its_own_holder():
    job = _failed("pay-3", "until_retention")
    retry_job(job.pk)
    assert fresh(job).status == "queued"


def test_bulk_retry_leaves_out_jobs_whose_key_is_held():
    blocked = _failed("bulk-key", "active")
    holder = keyed("bulk-key", "active")
    free = _failed("other-key", "active")
    plain = enqueue("ping", queue=unique_queue())
    fail_job(plain.pk, lease_token=claim(plain).lease_token, error_code="B", error_message="b")
    assert sorted(retry_jobs([blocked.pk, free.pk, plain.pk])) == sorted([free.pk, plain.pk])
    assert fresh(blocked).status == "failed" and fresh(holder).status == "queued"


def test_bulk_retry_of_two_jobs_with_one_key_retries_one():
    first = _failed("twice", "active")
    second = _failed("twice", "active")
    assert first.pk != second.pk
    retried = retry_jobs([first.pk, second.pk])
    assert len(retried) == 1
    assert sorted(fresh(j).status for j in (first, second)) == ["failed", "queued"]


# --- concurrency -------------------------------------------------------------------------


def _race(n: int, spec: JobSpec) -> list[Job]:
    """``n`` threads enqueue ``spec`` at once, each on its own connection."""
    start = threading.Barrier(n)
    got: list[Job] = []
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            start.wait(timeout=20)
            got.append(enqueue_many([spec])[0])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=racer) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(got) == n
    return got


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["queued", "active", "until_retention"])
def test_twenty_concurrent_enqueues_of_one_key_make_one_job(mode):
    key = f"race-{uuid.uuid4().hex}"
    got = _race(20, JobSpec("ping", unique_key=key, unique_while=mode))
    assert len({j.pk for j in got}) == 1
    assert sorted(j.duplicate for j in got) == [False] + [True] * 19
    assert Job.objects.filter(unique_key=key).count() == 1
    # No event row (job.enqueued is implied) and one job.enqueued on the one job's timeline.
    assert not JobEvent.objects.filter(job__unique_key=key).exists()
    assert timeline(got[0]) == [(1, "job.enqueued")]


def test_a_holder_that_leaves_its_window_before_the_read_makes_room(monkeypatch):
    """The INSERT met the holder; it finished before the read: the enqueue inserts again."""
    holder = keyed("slipping", "active")
    held = claim(holder)
    real = enqueue_module.key_holders

    def finishing_first(keys, *, using="default"):
        if fresh(holder).status == "running":
            complete_job(holder.pk, lease_token=held.lease_token, result=None)
        return real(keys, using=using)

    monkeypatch.setattr(enqueue_module, "key_holders", finishing_first)
    job = keyed("slipping", "active")
    assert job.duplicate is False and job.pk != holder.pk
    assert fresh(job).status == "queued" and timeline(job) == [(1, "job.enqueued")]
    assert [j.status for j in holders("slipping")] == ["succeeded", "queued"]


def test_a_key_that_never_settles_is_an_error_not_a_loop(monkeypatch):
    keyed("restless", "active")
    monkeypatch.setattr(enqueue_module, "key_holders", lambda keys, *, using="default": {})
    with pytest.raises(EnqueueError) as info:
        keyed("restless", "active")
    assert "unique_key" in info.value.errors
    assert len(holders("restless")) == 1


# --- the hot path ----------------------------------------------------------------------


def test_a_key_costs_no_query_until_it_is_a_duplicate():
    def queries(**options) -> int:
        with CaptureQueriesContext(connection) as seen:
            enqueue("ping", **options)
        return len(seen.captured_queries)

    plain = queries()
    assert queries(unique_key="hot") == plain
    assert queries(unique_key="hot") == plain + 1  # the holder's read
    if connection.vendor == "postgresql":
        assert plain == 1


# --- timeout_seconds ----------------------------------------------------------------------


@pytest.fixture
def timed_operation():
    """An operation that declares ``timeout_seconds`` (read with getattr by enqueue)."""

    class Timed(Operation):
        name = "test.timed"
        timeout_seconds = 7.5

        def execute(self, ctx, payload):
            return None

    registry.register(Timed)
    yield Timed.name
    registry.unregister(Timed.name)


def test_timeout_seconds_is_stored(timed_operation):
    assert fresh(enqueue("ping", timeout_seconds=2)).timeout_seconds == 2.0
    assert fresh(enqueue("ping", timeout_seconds=0.25)).timeout_seconds == 0.25
    assert fresh(enqueue("ping")).timeout_seconds is None
    assert fresh(enqueue(timed_operation)).timeout_seconds == 7.5
    assert fresh(enqueue(timed_operation, timeout_seconds=1)).timeout_seconds == 1.0
    jobs = enqueue_many([JobSpec("ping", timeout_seconds=3), JobSpec("ping")])
    assert [fresh(j).timeout_seconds for j in jobs] == [3.0, None]
    assert jobs[0].timeout_seconds == 3.0
    assert fresh(enqueue("ping", timeout_seconds=MAX_TIMEOUT_SECONDS)).timeout_seconds == (
        MAX_TIMEOUT_SECONDS
    )


@pytest.mark.parametrize(
    "value", [0, -1, math.nan, math.inf, True, "5", MAX_TIMEOUT_SECONDS + 1, [1]]
)
def test_bad_timeouts_are_refused(value):
    before = Job.objects.count()
    with pytest.raises(EnqueueError) as info:
        enqueue("ping", timeout_seconds=value)
    assert list(info.value.errors) == ["timeout_seconds"]
    assert "30 days" in info.value.errors["timeout_seconds"][0]
    assert Job.objects.count() == before
