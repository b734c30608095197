"""Priority aging (jobs.aging): a ready job's priority rises one step per interval waited,
up to the highest priority; future and running jobs are left alone. Both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs.aging import age_priorities
from jobs.clock import db_now
from jobs.enqueue import enqueue
from jobs.models import PRIORITY_MAX, Job
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_waiting_job_rises_one_step_per_interval():
    now = db_now()
    old = enqueue("ping", priority=-5, run_after=now - timedelta(seconds=35))
    fresh = enqueue("ping", priority=-5)
    later = enqueue("ping", priority=-5, run_after=now + timedelta(seconds=60))
    top = enqueue("ping", priority=PRIORITY_MAX, run_after=now - timedelta(seconds=100))
    for _ in range(5):  # one step per pass: 35 s waited at 10 s a step earns three
        age_priorities(every_seconds=10, now=now)
    old.refresh_from_db()
    assert (old.priority, old.priority_aged) == (-2, 3)
    for job in (fresh, later, top):
        before = job.priority
        job.refresh_from_db()
        assert job.priority == before and job.priority_aged == 0


def test_the_reaper_ages_only_when_the_setting_is_on(settings):
    job = enqueue("ping", priority=0, run_after=db_now() - timedelta(seconds=30))
    Reaper().run_once()
    assert Job.objects.get(id=job.id).priority == 0
    settings.CONTROLPLANE = {"PRIORITY_AGING_SECONDS": 5.0}
    result = Reaper().run_once()
    assert result.priorities_aged >= 1
    assert Job.objects.get(id=job.id).priority == 1


def test_the_reaper_prunes_idle_keys_but_keeps_lanes_with_queued_jobs():
    from jobs.key_state import IDLE_DAYS, prune_idle_keys
    from jobs.models import FairLane, FlowKey

    waiting = enqueue("ping", queue="prune-q", keys=["busy:1"])
    enqueue("ping", queue="prune-q", keys=["idle:1"]).delete()
    FlowKey.objects.create(key="idle:1")
    later = db_now() + timedelta(days=IDLE_DAYS, seconds=5)
    assert prune_idle_keys(later) == 2  # the idle lane and the idle key row
    assert set(FairLane.objects.values_list("key", flat=True)) == {"busy:1"}
    assert Job.objects.filter(id=waiting.id, status="queued").exists()
