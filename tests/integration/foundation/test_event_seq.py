"""Event seqs stay 1..N without gaps or duplicates under concurrent writers."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections, connection

from jobs.models import Job, JobEvent
from jobs.transitions import emit_event
from tests.factories import assert_consistent, running

pytestmark = pytest.mark.django_db


# --- event seq under concurrency ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_emits_get_seqs_without_gaps_or_duplicates():
    job, held = running()
    threads_n, per_thread = 6, 15
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def emit_many(n: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                emit_event(
                    job.pk,
                    event="t.tick",
                    fields={"thread": n, "i": i},
                    lease_token=held.lease_token,
                )
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=emit_many, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    events = assert_consistent(job)
    assert len(events) == 2 + threads_n * per_thread
    ticks = JobEvent.objects.filter(job=job, event="t.tick")
    assert {(e.fields["thread"], e.fields["i"]) for e in ticks} == {
        (n, i) for n in range(threads_n) for i in range(per_thread)
    }
    # Within one thread the seqs grow in the order it emitted.
    for n in range(threads_n):
        seqs = [
            e.seq for e in sorted(ticks, key=lambda e: e.fields["i"]) if e.fields["thread"] == n
        ]
        assert seqs == sorted(seqs)


# --- the events page reads what the ORM reads ----------------------------------------


def test_the_events_page_builds_the_events_the_orm_reads():
    """``job_events_page`` types its rows itself (a plain cursor and Django's converters):
    ids, timestamps, JSON and text must come back exactly as the ORM gives them."""
    from jobs.selectors.jobs import job_events_page

    job, held = running()
    emit_event(
        job.pk,
        event="t.data",
        message="naïve → ✓ <b>",
        level="warning",
        fields={"nested": {"list": [1, 2.5, None, "x"]}, "flag": True},
        lease_token=held.lease_token,
    )
    expected = list(JobEvent.objects.filter(job_id=job.pk).order_by("seq"))
    assert [e.seq for e in expected] == [2, 3]  # seq 1 is implied, not stored

    last, events = job_events_page(job.pk)

    assert last == expected[-1].seq
    fields = [f.attname for f in JobEvent._meta.concrete_fields]
    # The implied job.enqueued first, unsaved, at the job's created_at (as the ORM reads it).
    created_at = Job.objects.get(pk=job.pk).created_at
    assert {f: getattr(events[0], f) for f in fields} == {
        "id": None,
        "job_id": job.pk,
        "seq": 1,
        "ts": created_at,
        "event": "job.enqueued",
        "level": "info",
        "message": "",
        "fields": {},
    }
    assert events[0].ts.tzinfo is not None
    # The stored ones exactly as the ORM builds them.
    assert [[getattr(e, f) for f in fields] for e in events[1:]] == [
        [getattr(e, f) for f in fields] for e in expected
    ]
    assert events[-1].fields == {"nested": {"list": [1, 2.5, None, "x"]}, "flag": True}
    assert events[-1].ts.tzinfo is not None and events[-1].job_id == job.pk
    assert job_events_page(job.pk, after=last) == (last, [])
    assert job_events_page(job.pk, after=1, limit=1)[1] == expected[0:1]
