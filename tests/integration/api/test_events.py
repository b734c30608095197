"""GET /jobs/<id>/events?after=N: the timeline cursor, including under concurrent writers."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job, JobEvent
from jobs.transitions import emit_event
from tests.conftest import wait_for
from tests.factories import queued, running

from .conftest import assert_error_shape


@pytest.mark.django_db
def test_events_after_a_seq_ascending(viewer):
    job, held = running()
    for n in range(3):
        emit_event(
            job.pk,
            event="test.step",
            message=f"step {n}",
            fields={"n": n},
            lease_token=held.lease_token,
        )
    body = viewer.get(f"/jobs/{job.pk}/events").json()
    assert [e["seq"] for e in body["results"]] == [1, 2, 3, 4, 5]
    assert [e["event"] for e in body["results"]][:2] == ["job.enqueued", "job.started"]
    assert body["last_seq"] == 5 and body["has_more"] is False
    step = body["results"][2]
    assert set(step) == {"seq", "ts", "event", "level", "message", "fields"}
    assert step["message"] == "step 0" and step["fields"] == {"n": 0} and step["level"] == "info"
    assert step["ts"].endswith("Z")

    after = viewer.get(f"/jobs/{job.pk}/events/", after=3).json()
    assert [e["seq"] for e in after["results"]] == [4, 5] and after["last_seq"] == 5
    empty = viewer.get(f"/jobs/{job.pk}/events", after=5).json()
    assert empty == {"results": [], "last_seq": 5, "has_more": False}
    # An 'after' past the end is capped at the real last seq: the client resumes
    # there and sees seq 6 when it comes, instead of skipping to 100.
    beyond = viewer.get(f"/jobs/{job.pk}/events", after=99).json()
    assert beyond["results"] == [] and beyond["last_seq"] == 5
    far = viewer.get(f"/jobs/{job.pk}/events", after=10**30)  # past any 32- or 64-bit seq
    assert far.status_code == 200 and far.json()["last_seq"] == 5, far.content
    emit_event(job.pk, event="test.late", lease_token=held.lease_token)
    resumed = viewer.get(f"/jobs/{job.pk}/events", after=beyond["last_seq"]).json()
    assert [e["seq"] for e in resumed["results"]] == [6] and resumed["last_seq"] == 6


@pytest.mark.django_db
def test_the_enqueue_event_is_implied_by_the_job_row_and_served_as_seq_one(viewer):
    """Enqueue stores the job alone (jobs.timeline); readers still see seq 1 first."""
    [job, other] = enqueue_many([JobSpec("ping"), JobSpec("ping", priority=3)])
    assert not JobEvent.objects.filter(job_id__in=[job.pk, other.pk]).exists()
    assert Job.objects.get(pk=job.pk).last_event_seq == 1
    body = viewer.get(f"/jobs/{job.pk}/events").json()
    assert body == {
        "results": [
            {
                "seq": 1,
                "ts": body["results"][0]["ts"],
                "event": "job.enqueued",
                "level": "info",
                "message": "",
                "fields": {},
            }
        ],
        "last_seq": 1,
        "has_more": False,
    }
    created = Job.objects.get(pk=job.pk).created_at
    assert parse_datetime(body["results"][0]["ts"]) == created
    assert viewer.get(f"/jobs/{job.pk}/events", after=1).json()["results"] == []
    # The next event is stored as seq 2; the page from the start is 1, 2, gap-free.
    emit_event(job.pk, event="test.step")
    assert list(JobEvent.objects.filter(job_id=job.pk).values_list("seq", flat=True)) == [2]
    page = viewer.get(f"/jobs/{job.pk}/events", limit=1).json()
    assert [e["seq"] for e in page["results"]] == [1] and page["has_more"] is True
    page = viewer.get(f"/jobs/{job.pk}/events", after=page["last_seq"]).json()
    assert [(e["seq"], e["event"]) for e in page["results"]] == [(2, "test.step")]


@pytest.mark.django_db
def test_events_limit_pages_through(viewer):
    job = queued()
    for n in range(6):
        emit_event(job.pk, event="test.step", fields={"n": n})
    page = viewer.get(f"/jobs/{job.pk}/events", after=0, limit=4).json()
    assert [e["seq"] for e in page["results"]] == [1, 2, 3, 4] and page["has_more"] is True
    page = viewer.get(f"/jobs/{job.pk}/events", after=page["last_seq"], limit=4).json()
    assert [e["seq"] for e in page["results"]] == [5, 6, 7] and page["has_more"] is False


@pytest.mark.django_db
@pytest.mark.parametrize("after", ["x", "-1", "1.5"])
def test_events_refuse_a_bad_after(viewer, after):
    job = queued()
    error = assert_error_shape(viewer.get(f"/jobs/{job.pk}/events", after=after), 400)
    assert "after" in error["errors"]


@pytest.mark.django_db
def test_events_of_unknown_or_malformed_ids_are_404(viewer):
    assert_error_shape(viewer.get(f"/jobs/{uuid.uuid4()}/events"), 404)
    assert_error_shape(viewer.get("/jobs/not-a-uuid/events"), 404)
    assert_error_shape(viewer.get(f"/jobs/{uuid.uuid4()}/events", after=3), 404)


@pytest.mark.django_db(transaction=True)
def test_poller_sees_every_seq_once_in_order_under_concurrent_writers(api_for):
    viewer = api_for("viewer")
    job = queued()
    writers, per_writer = 4, 40
    total = 1 + writers * per_writer  # job.enqueued + every emit
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(index: int) -> None:
        try:
            start.wait(timeout=10)
            for n in range(per_writer):
                emit_event(job.pk, event="test.write", fields={"writer": index, "n": n})
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    seen: list[int] = []
    last_seq = 0

    def poll() -> bool:
        nonlocal last_seq
        body = viewer.get(f"/jobs/{job.pk}/events", after=last_seq, limit=7).json()
        seqs = [e["seq"] for e in body["results"]]
        seen.extend(seqs)
        assert body["last_seq"] == (seqs[-1] if seqs else last_seq)
        last_seq = body["last_seq"]
        return last_seq >= total and not any(t.is_alive() for t in threads)

    wait_for(poll, timeout=60, interval=0.005, message="the poller to see every event")
    for thread in threads:
        thread.join(timeout=10)
    assert not errors, errors
    assert seen == list(range(1, total + 1))
    # Each writer's events appear in the order it wrote them.
    body = viewer.get(f"/jobs/{job.pk}/events", limit=1000).json()
    for index in range(writers):
        mine = [e["fields"]["n"] for e in body["results"] if e["fields"].get("writer") == index]
        assert mine == list(range(per_writer))


def _postgres_lock_waiters() -> int:
    """Backends of this database waiting on a lock (PostgreSQL), from a fresh connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_poller_waits_for_a_writer_holding_its_transaction_and_misses_nothing(api_for):
    """Writer A holds seq 2 uncommitted while writer B queues behind it for seq 3.

    The poller sees only seq 1 meanwhile (never 3 before 2), then 2 and 3 in
    order once A commits.
    """
    viewer = api_for("viewer")
    job = queued()
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                emit_event(job.pk, event="test.held")
                holding.set()
                release.wait(timeout=30)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
        finally:
            holding.set()
            connection.close()

    def wait_then_write() -> None:
        try:
            emit_event(job.pk, event="test.waiter")
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(timeout=20)
    waiter = threading.Thread(target=wait_then_write)
    waiter.start()
    try:
        if connection.vendor == "postgresql":
            wait_for(
                lambda: _postgres_lock_waiters() >= 1,
                timeout=20,
                message="writer B to wait on writer A's row lock",
            )
        for _ in range(5):
            body = viewer.get(f"/jobs/{job.pk}/events").json()
            assert [e["seq"] for e in body["results"]] == [1] and body["last_seq"] == 1
        assert waiter.is_alive()  # still queued behind A
    finally:
        release.set()
        holder.join(timeout=20)
        waiter.join(timeout=40)
    assert not errors, errors
    body = viewer.get(f"/jobs/{job.pk}/events", after=1).json()
    assert [(e["seq"], e["event"]) for e in body["results"]] == [
        (2, "test.held"),
        (3, "test.waiter"),
    ]
    assert body["last_seq"] == 3


@pytest.mark.django_db(transaction=True)
def test_poller_sees_every_seq_once_while_claim_and_cancel_race_with_emits(api_for):
    """Transitions (claim's job.started, cancel's events) and emits share one seq line."""
    from jobs.claims import claim_jobs
    from jobs.models import Job
    from jobs.transitions import cancel_job

    viewer = api_for("viewer")
    job = queued()
    emitters, per_emitter = 3, 25
    start = threading.Barrier(emitters + 1)
    errors: list[BaseException] = []

    def emit(index: int) -> None:
        try:
            start.wait(timeout=10)
            for n in range(per_emitter):
                emit_event(job.pk, event="test.mixed", fields={"writer": index, "n": n})
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    def claim_then_cancel() -> None:
        try:
            start.wait(timeout=10)
            # SKIP LOCKED passes over the row while an emitter holds it: try again.
            wait_for(
                lambda: claim_jobs(
                    queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30
                ),
                timeout=30,
                interval=0.001,
                message="the claim to find the job unlocked",
            )
            cancel_job(job.pk, by="test", reason="mixed with emits")
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=emit, args=(i,)) for i in range(emitters)]
    threads.append(threading.Thread(target=claim_then_cancel))
    for thread in threads:
        thread.start()
    seen: list[int] = []
    last_seq = 0

    def poll() -> bool:
        nonlocal last_seq
        body = viewer.get(f"/jobs/{job.pk}/events", after=last_seq, limit=5).json()
        seqs = [e["seq"] for e in body["results"]]
        seen.extend(seqs)
        assert body["last_seq"] == (seqs[-1] if seqs else last_seq)
        last_seq = body["last_seq"]
        if any(t.is_alive() for t in threads):
            return False
        return last_seq >= Job.objects.get(pk=job.pk).last_event_seq

    wait_for(poll, timeout=90, interval=0.005, message="the poller to see every event")
    for thread in threads:
        thread.join(timeout=10)
    assert not errors, errors
    total = Job.objects.get(pk=job.pk).last_event_seq
    assert seen == list(range(1, total + 1))
    names = [e["event"] for e in viewer.get(f"/jobs/{job.pk}/events", limit=1000).json()["results"]]
    assert names.count("test.mixed") == emitters * per_emitter
    assert "job.started" in names and "job.cancelled" in names
    assert names.index("job.started") < names.index("job.cancelled")
