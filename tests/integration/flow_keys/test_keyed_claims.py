"""The keyed claim in-process (jobs.keyed_claims): limits by key, fair turns, priority within
a key, rate buckets by key, and the usual claim leaving keyed jobs alone. Both databases."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, transaction

from jobs.claims import Completion, claim_jobs, complete_jobs
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.exceptions import EnqueueError
from jobs.flow_keys import Key
from jobs.key_limits import cache
from jobs.keyed_claims import claim_keyed
from jobs.models import FlowKey, Job, KeyLimit, Queue, Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_id():
    return Worker.objects.create(name="keyed-test", queues=["*"]).id


@pytest.fixture
def queue():
    return f"keyed-{uuid.uuid4().hex[:8]}"


def limit(name: str, **values) -> None:
    KeyLimit.objects.update_or_create(name=name, defaults=values)
    cache.forget()


def claim(queue, worker_id, n=10, **kw):
    return claim_keyed(queue=queue, worker_id=worker_id, limit=n, lease_seconds=30, **kw)


def finish(jobs) -> None:
    complete_jobs([Completion(j.id, j.lease_token) for j in jobs])


@contextmanager
def held_in_another_transaction(work: Callable[[], object]) -> Iterator[None]:
    """Run ``work`` in a transaction of another thread's connection, open until the block ends."""
    done = threading.Event()
    release = threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                work()
                done.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert done.wait(10)
        yield
    finally:
        release.set()
        holder.join(10)


def test_keys_come_from_the_enqueue_and_take_turns(queue):
    job = enqueue("ping", queue=queue, keys=["account:1", "api:9"])
    job.refresh_from_db()
    assert job.flow_keys == ["account:1", "api:9"]
    assert job.fair_key == "account:1"
    assert job.fair_turn == pytest.approx(0.0)
    assert Queue.objects.get(name=queue).keyed


@pytest.fixture
def open_op():
    from jobs.operations import operation, registry

    name = f"keyed.open.{uuid.uuid4().hex[:6]}"
    operation(name)(lambda ctx, p: None)
    yield name
    registry.unregister(name)


def test_a_template_names_a_field_the_payload_lacks(queue, open_op):
    with pytest.raises(EnqueueError) as error:
        enqueue(open_op, {"x": 1}, queue=queue, keys=["account:{account_id}"])
    assert "account_id" in error.value.errors["keys"][0]
    with pytest.raises(EnqueueError) as error:
        enqueue(open_op, {"account_id": {"a": 1}}, queue=queue, keys=["account:{account_id}"])
    assert "not a string" in error.value.errors["keys"][0]
    job = enqueue(open_op, {"account_id": 42}, queue=queue, keys=[Key("account:{account_id}")])
    assert job.flow_keys == ["account:42"]
    assert not Job.objects.filter(queue=queue, flow_keys__isnull=True).exists()


def test_the_usual_claim_leaves_keyed_jobs_alone(queue, worker_id):
    enqueue_many([JobSpec("ping", queue=queue, keys=["a:1"]) for _ in range(3)])
    plain = enqueue("ping", queue=queue)
    got = claim_jobs(queues=[queue], worker_id=worker_id, limit=10, lease_seconds=30)
    assert [j.id for j in got] == [plain.id]
    assert len(claim(queue, worker_id).jobs) == 3


def test_concurrency_by_key_across_claims(queue, worker_id):
    limit("acct", concurrency=2)
    enqueue_many([JobSpec("ping", queue=queue, keys=["acct:1"]) for _ in range(5)])
    enqueue_many([JobSpec("ping", queue=queue, keys=["acct:2"]) for _ in range(5)])
    first = claim(queue, worker_id).jobs
    assert len(first) == 4  # two of each account
    assert claim(queue, worker_id).jobs == []
    finish(first[:1])
    again = claim(queue, worker_id).jobs
    assert len(again) == 1
    assert Job.objects.get(id=again[0].id).fair_key == Job.objects.get(id=first[0].id).fair_key


def test_a_key_of_its_own_wins_over_its_family(queue, worker_id):
    limit("acct", concurrency=1)
    limit("acct:vip", concurrency=3)
    enqueue_many([JobSpec("ping", queue=queue, keys=["acct:vip"]) for _ in range(5)])
    assert len(claim(queue, worker_id).jobs) == 3


def test_every_key_of_a_job_must_have_room(queue, worker_id):
    limit("api", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"acct:{i}", "api:shared"]) for i in range(4)])
    assert len(claim(queue, worker_id).jobs) == 1


def test_round_robin_across_keys(queue, worker_id):
    enqueue_many([JobSpec("ping", queue=queue, keys=["big"]) for _ in range(200)])
    small = enqueue_many([JobSpec("ping", queue=queue, keys=["small"]) for _ in range(10)])
    started = []
    for _ in range(20):
        started += [j.id for j in claim(queue, worker_id, n=1).jobs]
    small_ids = {j.id for j in small}
    assert small_ids <= set(started)


def test_priority_orders_jobs_within_a_key_without_taking_other_keys_turns(queue, worker_id):
    enqueue_many([JobSpec("ping", queue=queue, keys=["a"]) for _ in range(5)])
    enqueue_many([JobSpec("ping", queue=queue, keys=["b"]) for _ in range(5)])
    urgent = enqueue("ping", queue=queue, keys=["a"], priority=10)
    first = claim(queue, worker_id, n=1).jobs
    assert [j.id for j in first] == [urgent.id]
    second = claim(queue, worker_id, n=1).jobs
    assert Job.objects.get(id=second[0].id).fair_key == "b"


def test_rate_by_key(queue, worker_id):
    limit("api", rate=2.0, burst=2.0)
    enqueue_many([JobSpec("ping", queue=queue, keys=["api:1"]) for _ in range(6)])
    first = claim(queue, worker_id)
    assert len(first.jobs) == 2
    empty = claim(queue, worker_id)
    assert empty.jobs == [] and 0 < empty.retry_in <= 0.5
    time.sleep(0.6)
    assert len(claim(queue, worker_id).jobs) == 1


def test_each_bucket_spent_is_its_own_keys_among_many(queue, worker_id):
    """One claim over keys with concurrency only and one with a rate: the token comes off the
    rate key's bucket, not another key's (PostgreSQL's function zips the keys' arrays)."""
    limit("acct", concurrency=1)
    limit("api", rate=0.01, burst=1.0)
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"acct:{n}"]) for n in range(3)])
    enqueue_many([JobSpec("ping", queue=queue, keys=["api:7"]) for _ in range(2)])
    assert len(claim(queue, worker_id).jobs) == 4
    buckets = {k.key: (k.tokens, k.refilled_at) for k in FlowKey.objects.all()}
    assert buckets["api:7"][0] == pytest.approx(0.0) and buckets["api:7"][1] is not None
    assert all(buckets[f"acct:{n}"][1] is None for n in range(3))


def test_declared_limits_exist_before_the_first_claim(queue, worker_id):
    from jobs.operations import operation, registry

    name = f"keyed.op.{uuid.uuid4().hex[:6]}"
    fam = f"fam{uuid.uuid4().hex[:6]}"
    operation(name, queue=queue, keys=[Key(fam + ":{n}", concurrency=1)])(lambda ctx, p: None)
    try:
        enqueue_many([JobSpec(name, {"n": 1}) for _ in range(3)])
        assert KeyLimit.objects.get(name=fam).concurrency == 1
        cache.forget()
        assert len(claim(queue, worker_id).jobs) == 1
    finally:
        registry.unregister(name)


def test_the_queues_cap_counts_keyed_and_unkeyed_jobs_together(queue, worker_id):
    enqueue_many([JobSpec("ping", queue=queue) for _ in range(2)])
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"k:{i}"]) for i in range(5)])
    plain = claim_jobs(queues=[queue], worker_id=worker_id, limit=10, lease_seconds=30, cap=3)
    assert len(plain) == 2
    assert len(claim(queue, worker_id, cap=3).jobs) == 1  # 3 running: the cap is full
    assert claim(queue, worker_id, cap=3).jobs == []


def test_the_queues_bucket_and_the_keys_limits_compose(queue, worker_id):
    from jobs.rate_limits import claim_rate_limited

    Queue.objects.filter(name=queue).update(rate_limit_per_second=3)
    limit("acct", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"acct:{i % 2}"]) for i in range(8)])
    Queue.objects.filter(name=queue).update(rate_limit_per_second=3)

    def keyed(n):
        return claim(queue, worker_id, n=n).jobs

    first = claim_rate_limited(
        queue=queue, worker_id=worker_id, limit=10, lease_seconds=30, claimer=keyed
    )
    assert len(first.jobs) == 2  # the bucket held 3; the keys allowed one each
    finish(first.jobs)
    second = claim_rate_limited(
        queue=queue, worker_id=worker_id, limit=10, lease_seconds=30, claimer=keyed
    )
    assert len(second.jobs) == 1  # one token left (tokens found no job are given back)
    assert second.retry_in is not None


def test_a_claim_reads_past_keys_at_their_limit(queue, worker_id):
    limit("busy", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"busy:{n}"]) for n in range(70)])
    assert len(claim(queue, worker_id, n=70).jobs) == 70  # every busy key at its limit now
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"busy:{n}"]) for n in range(70)])
    fresh = enqueue("ping", queue=queue, keys=["fresh:1"])
    assert [j.id for j in claim(queue, worker_id, n=1).jobs] == [fresh.id]


def test_a_claim_held_back_by_full_keys_asks_to_try_again_soon(queue, worker_id):
    limit("solo", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=["solo:1"]) for _ in range(2)])
    assert len(claim(queue, worker_id).jobs) == 1
    held = claim(queue, worker_id)  # the key is full: its job is left out of the window
    assert held.jobs == [] and held.retry_in is not None and held.retry_in <= 0.5


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite lets one claimer in at a time"
)
def test_claimers_at_once_take_different_turns(queue, worker_id):
    """A claim whose transaction is still open holds its turns; a second claim takes the next."""
    limit("tenant", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=[f"tenant:{n % 100}"]) for n in range(200)])
    first: list = []
    with held_in_another_transaction(lambda: first.extend(claim(queue, worker_id, n=16).jobs)):
        second = claim(queue, worker_id, n=16).jobs
    keys = [Job.objects.get(pk=j.id).fair_key for j in [*first, *second]]
    assert len(first) == len(second) == 16
    assert len(set(keys)) == 32  # keys of limit 1: none started twice


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement cycle is PostgreSQL's"
)
def test_a_cycle_that_ends_a_keys_job_starts_its_next_in_the_same_statement(queue, worker_id):
    """A worker's cycle completes and claims in one statement (``complete_and_claim`` with a
    keyed pick): the job it ends frees its key's one slot for the next, and that next one
    starts no earlier than the end it followed, by the events' clock."""
    from jobs import events
    from jobs.claims import complete_and_claim
    from jobs.keyed_claims import keyed_pick, settled
    from jobs.models import JobEvent

    limit("solo", concurrency=1)
    enqueue_many([JobSpec("ping", queue=queue, keys=["solo:1"]) for _ in range(3)])
    [first] = claim(queue, worker_id, n=4).jobs
    pick = keyed_pick(queue, limit=4)
    moved, [second] = complete_and_claim(
        [Completion(first.id, first.lease_token)],
        queues=[queue],
        worker_id=worker_id,
        limit=4,
        lease_seconds=30,
        after=[pick],
    )
    assert moved == [first.id]
    assert pick.found["started"] == 1 and pick.found["held_back"]  # the third waits its turn
    assert settled(pick) is not None  # and the worker tries again soon
    ended = JobEvent.objects.get(job_id=first.id, event=events.JOB_SUCCEEDED).ts
    started = JobEvent.objects.get(job_id=second.id, event=events.JOB_STARTED).ts
    assert started >= ended
    assert Job.objects.get(pk=second.id).started_at == started
    # A completion whose lease is no longer its job's frees nothing.
    pick = keyed_pick(queue, limit=4)
    stale = Completion(first.id, first.lease_token)
    assert complete_and_claim(
        [stale], queues=[queue], worker_id=worker_id, limit=4, lease_seconds=30, after=[pick]
    ) == ([], [])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks on keys: PostgreSQL's")
def test_a_key_another_claimer_holds_is_skipped_and_a_new_key_is_made(queue, worker_id):
    """The claim locks the keys' rows that exist, then makes the missing ones: a key whose row
    another transaction holds is passed over this round (nobody waits on a key), while a key
    seen for the first time gets its row and its job starts."""
    limit("acct", concurrency=2)
    enqueue("ping", queue=queue, keys=["acct:held"])
    claim(queue, worker_id, n=1)  # acct:held has its row now, and one job of two running
    held = enqueue("ping", queue=queue, keys=["acct:held"])
    fresh = enqueue("ping", queue=queue, keys=["acct:fresh"])
    with held_in_another_transaction(
        lambda: FlowKey.objects.select_for_update().get(key="acct:held")
    ):
        assert not FlowKey.objects.filter(key="acct:fresh").exists()
        assert [j.id for j in claim(queue, worker_id, n=4).jobs] == [fresh.id]
    assert FlowKey.objects.filter(key="acct:fresh").exists()
    assert [j.id for j in claim(queue, worker_id, n=4).jobs] == [held.id]
