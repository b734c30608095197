"""GET /jobs/<id>/events?after=N: the timeline cursor, including under concurrent writers."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from jobs.transitions import emit_event
from tests.conftest import wait_for
from tests.integration.foundation.helpers import queued, running

from .conftest import assert_error_shape


@pytest.mark.django_db
def test_events_after_a_seq_ascending(viewer):
    job, held = running()
    for n in range(3):
        emit_event(job.pk, event="test.step", message=f"step {n}", fields={"n": n},
                   lease_token=held.lease_token)
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
    emit_event(job.pk, event="test.late", lease_token=held.lease_token)
    resumed = viewer.get(f"/jobs/{job.pk}/events", after=beyond["last_seq"]).json()
    assert [e["seq"] for e in resumed["results"]] == [6] and resumed["last_seq"] == 6


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
