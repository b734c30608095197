"""The batch protocol step by step, in this process, on the real database.

Each test drives one race of the coordinator / batch / write protocol into
a fixed order (a coordinator requeued after its dispatch, batches written
before it defers, a redelivered message, a dead parent) and checks that the
parent ends counted exactly once.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from jobs import batches, transitions
from jobs.batches import claim_messages, dispatch_batches, write_batch
from jobs.clock import db_now
from jobs.models import BatchMessage, BatchReceipt, Job, JobEvent
from jobs.operations import registry
from jobs.rescues import requeue_expired_leases
from jobs.transitions import cancel_job, defer_job, emit_event, has_cancelled_ancestor
from tests.factories import (
    assert_consistent,
    claim,
    context,
    fresh,
    queued,
    running,
)
from tests.integration.timelines import events_of
from workers.batch_runner import MessageFlight, run_message

pytestmark = pytest.mark.django_db


def drain(queue: str, *, limit: int = 1000) -> list[str]:
    """Run every visible message of ``queue`` once, as a consumer would."""
    return [
        run_message(MessageFlight(m))
        for m in claim_messages(queue=queue, limit=limit, visibility_seconds=30)
    ]


def events(job: Job, name: str) -> int:
    return events_of(job).count(name)


def coordinate(n: int):
    """A running ``fanout`` parent whose coordinator dispatched ``n`` batches (not yet deferred)."""
    parent, held = running("fanout", payload={"batches": n})
    outcome = registry.get("fanout").execute(context(held), held.payload)
    return parent, held, outcome


def test_batches_written_before_the_coordinator_defers_close_the_parent_at_defer():
    parent, held, outcome = coordinate(3)
    batch_queue = f"{parent.queue}.batch"
    write_queue = f"{parent.queue}.write"
    assert drain(batch_queue) == ["processed"] * 3
    # The writes count, but may not close a parent whose coordinator still holds the lease.
    assert drain(write_queue) == ["written"] * 3
    row = fresh(parent)
    assert (row.status, row.progress_current, row.lease_token) == ("running", 3, held.lease_token)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    row = fresh(parent)
    assert row.status == "succeeded"
    assert row.result == {"batches": 3, "batches_written": 3}
    assert [e for _, e in assert_consistent(parent)][-2:] == ["job.deferred", "job.succeeded"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's clock is this process's")
def test_write_messages_are_visible_at_once_to_a_clock_reading_that_lags(lagging_clock_reading):
    """A reading of the database's clock lags by up to its round trip (a slow one under
    load): messages stamped with this host's clock were invisible to claims until it passed."""
    parent, _held, _outcome = coordinate(2)
    assert drain(f"{parent.queue}.batch") == ["processed"] * 2
    assert drain(f"{parent.queue}.write") == ["written"] * 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's clock is this process's")
def test_a_message_made_visible_by_a_process_whose_reading_is_ahead_is_claimed_at_once(
    lagging_clock_reading,
):
    """Claims compare in the statement, on the database's clock: a consumer whose reading
    lags more than the releasing process's found its messages invisible until it passed."""
    parent, held, outcome = coordinate(1)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    BatchMessage.objects.filter(parent_id=parent.pk).update(visible_after=Now())
    claimed = claim_messages(queue=f"{parent.queue}.batch", limit=1, visibility_seconds=30)
    assert [m.batch_index for m in claimed] == [0]


def test_a_coordinator_with_no_batches_is_closed_by_its_defer():
    parent, held = running("fanout", payload={"batches": 1})
    assert dispatch_batches(context(held), operation="fanout.batch", payloads=[]) == 0
    defer_job(parent.pk, lease_token=held.lease_token, result={"batches": 0})
    row = fresh(parent)
    assert (row.status, row.progress_current, row.progress_total) == ("succeeded", 0, 0)
    assert events(parent, "job.deferred") == events(parent, "job.succeeded") == 1


def test_a_coordinator_run_twice_redispatches_and_every_batch_counts_once():
    parent, held, _ = coordinate(4)
    batch_queue = f"{parent.queue}.batch"
    write_queue = f"{parent.queue}.write"
    # Two batches are written, then the coordinator's lease expires before it defers.
    for message in claim_messages(queue=batch_queue, limit=2, visibility_seconds=30):
        run_message(MessageFlight(message))
    assert drain(write_queue) == ["written", "written"]
    Job.objects.filter(pk=parent.pk).update(leased_until=timezone.now())
    assert requeue_expired_leases(max_requeues=3) == ([parent.pk], [])
    # It runs again: the dispatch starts over instead of adding duplicates.
    again = claim(parent)
    outcome = registry.get("fanout").execute(context(again), again.payload)
    assert BatchMessage.objects.filter(parent_id=parent.pk).count() == 4
    assert not BatchReceipt.objects.filter(parent_id=parent.pk).exists()
    dispatched = JobEvent.objects.filter(job_id=parent.pk, event="batch.dispatched").order_by("seq")
    assert dispatched.last().fields["replaced_receipts"] == 2
    defer_job(parent.pk, lease_token=again.lease_token, result=outcome.result)
    drain(batch_queue)
    assert sorted(drain(write_queue)) == ["closed_parent", "written", "written", "written"]
    row = fresh(parent)
    assert (row.status, row.progress_current, row.progress_total) == ("succeeded", 4, 4)
    assert BatchReceipt.objects.filter(parent_id=parent.pk).count() == 4
    assert_consistent(parent)


def test_the_coordinator_cannot_overwrite_the_count_its_batches_own():
    parent, held, outcome = coordinate(2)
    drain(f"{parent.queue}.batch")
    drain(f"{parent.queue}.write")
    emit_event(
        parent.pk,
        event="coordinator.tick",
        lease_token=held.lease_token,
        fields={"_progress_current": 0, "_progress_total": 10},
    )
    assert (fresh(parent).progress_current, fresh(parent).progress_total) == (2, 2)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result, progress=(0, 10))
    assert fresh(parent).status == "succeeded"
    # A job without batches still reports its own progress.
    plain, plain_held = running()
    emit_event(
        plain.pk,
        event="tick",
        lease_token=plain_held.lease_token,
        fields={"_progress_current": 3, "_progress_total": 9},
    )
    assert (fresh(plain).progress_current, fresh(plain).progress_total) == (3, 9)


def test_a_write_message_delivered_twice_is_counted_once():
    parent, held, outcome = coordinate(2)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    drain(f"{parent.queue}.batch")
    write_queue = f"{parent.queue}.write"
    first, second = claim_messages(queue=write_queue, limit=2, visibility_seconds=30)
    # A consumer writes the first, but its ack is lost (it died after commit, say):
    # the message comes back and another consumer writes it again.
    duplicate = BatchMessage.objects.get(pk=first.id)
    duplicate.pk = None
    duplicate.attempts, duplicate.visible_after = 0, db_now()
    duplicate.save()
    assert write_batch(first) == "written"
    assert drain(write_queue) == ["duplicate"]
    assert write_batch(second) == "closed_parent"
    row = fresh(parent)
    assert (row.status, row.progress_current) == ("succeeded", 2)
    assert events(parent, "batch.written") == 2
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()


def test_a_write_for_a_parent_that_stopped_does_no_domain_work(monkeypatch):
    parent, held, outcome = coordinate(2)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    drain(f"{parent.queue}.batch")
    messages = claim_messages(queue=f"{parent.queue}.write", limit=2, visibility_seconds=30)
    cancel_job(parent.pk)
    writes = []
    op = batches.batch_registry.get("fanout.batch")
    monkeypatch.setattr(op, "write", lambda *args: writes.append(args))
    assert [write_batch(m) for m in messages] == ["dropped", "dropped"]
    assert writes == []
    assert not BatchReceipt.objects.filter(parent_id=parent.pk).exists()


def test_a_stale_delivery_cannot_ack_a_message_another_consumer_holds():
    parent, held, outcome = coordinate(1)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    (stale,) = claim_messages(queue=f"{parent.queue}.batch", limit=1, visibility_seconds=30)
    # Its visibility runs out and another consumer takes the message over.
    BatchMessage.objects.filter(pk=stale.id).update(visible_after=db_now())
    (current,) = claim_messages(queue=f"{parent.queue}.batch", limit=1, visibility_seconds=30)
    assert batches.hand_to_write_queue(stale, {"late": True}) is False
    assert BatchMessage.objects.filter(pk=current.id).exists()
    assert batches.hand_to_write_queue(current, {"index": 0}) is True
    writes = BatchMessage.objects.filter(parent_id=parent.pk, queue=f"{parent.queue}.write")
    assert writes.count() == 1


def test_a_message_whose_consumers_keep_dying_fails_the_parent_at_claim():
    parent, held, outcome = coordinate(1)
    defer_job(parent.pk, lease_token=held.lease_token, result=outcome.result)
    batch_queue = f"{parent.queue}.batch"
    BatchMessage.objects.filter(parent_id=parent.pk).update(max_attempts=2)
    for _ in range(2):  # two deliveries, each consumer killed mid-batch
        claimed = claim_messages(queue=batch_queue, limit=1, visibility_seconds=30)
        assert [m.batch_index for m in claimed] == [0]
        BatchMessage.objects.filter(pk=claimed[0].id).update(visible_after=db_now())
    # The third delivery is not handed out: the parent fails naming the batch.
    assert claim_messages(queue=batch_queue, limit=1, visibility_seconds=30) == []
    row = fresh(parent)
    assert (row.status, row.error_code) == ("failed", "BatchFailed")
    assert "Batch 0 (fanout.batch)" in row.error_message
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()
    assert_consistent(parent)


def test_cancelled_ancestor_is_found_at_any_depth():
    root = queued("sleep", payload={"seconds": 1})
    middle = queued(parent=root.pk)
    leaf = queued(parent=middle.pk)
    assert not has_cancelled_ancestor(leaf.pk)
    # Cancel the root alone, bypassing the cascade, as if the children were claimed in between.
    transitions.move(
        target=transitions.CANCELLED,
        job_ids=[root.pk],
        event=transitions.Event("job.cancelled"),
        assign={"finished_at": timezone.now()},
    )
    assert has_cancelled_ancestor(leaf.pk) and has_cancelled_ancestor(middle.pk)
    assert not has_cancelled_ancestor(root.pk)
