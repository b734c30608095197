"""Bulk enqueue keeps the cyclic collector off while it works, and leaves it as it found it."""

from __future__ import annotations

import gc

import pytest

from jobs.enqueue import PAUSE_COLLECTOR_FROM, JobSpec, enqueue_many
from jobs.exceptions import EnqueueError
from jobs.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def collector_restored():
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def specs(n: int, operation: str = "sleep") -> list[JobSpec]:
    return [JobSpec(operation, {"seconds": 0}) for _ in range(n)]


def test_the_collector_is_on_again_after_a_bulk_enqueue(collector_restored, monkeypatch):
    import jobs.enqueue as module

    seen: list[bool] = []
    real = module._enqueue_many

    def watching(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(module, "_enqueue_many", watching)
    gc.enable()
    enqueue_many(specs(PAUSE_COLLECTOR_FROM))
    enqueue_many(specs(2))
    assert seen == [False, True]  # paused for the big batch only
    assert gc.isenabled()
    assert Job.objects.count() == PAUSE_COLLECTOR_FROM + 2


def test_a_failed_bulk_enqueue_switches_it_back_on(collector_restored):
    gc.enable()
    with pytest.raises(EnqueueError):
        enqueue_many([*specs(PAUSE_COLLECTOR_FROM), JobSpec("no.such.operation")])
    assert gc.isenabled() and Job.objects.count() == 0


def test_a_collector_switched_off_by_the_caller_stays_off(collector_restored):
    gc.disable()
    enqueue_many(specs(PAUSE_COLLECTOR_FROM))
    assert not gc.isenabled()
