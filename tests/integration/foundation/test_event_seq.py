"""Event seqs stay 1..N without gaps or duplicates under concurrent writers."""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections, connection

from jobs.models import JobEvent
from jobs.transitions import emit_event

from .helpers import assert_consistent, running

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
