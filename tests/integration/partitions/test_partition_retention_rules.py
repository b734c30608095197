"""Partition retirement under retention by status (PostgreSQL): a partition goes only once
it is past the longest retention in force, and jobs of a shorter one go on time, their
events row by row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from jobs.models import Job, JobEvent
from jobs.partitions import event_partitions, period_start
from tests.integration.partitions.test_partitions import (
    DAY,
    make_job,
    names,
    partition_of,
    past_partitions,
)
from workers.config import ReaperConfig
from workers.reaper import Reaper

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps a plain table"),
]


@override_settings(CONTROLPLANE={"RETENTION_DAYS_BY_STATUS": {"succeeded": 1, "failed": 30}})
def test_a_partition_waits_for_the_longest_retention_and_short_ones_go_on_time():
    past_partitions(days_ago=12, count=1)
    old = period_start(timezone.now(), DAY) - DAY * 12 + timedelta(hours=2)
    kept_failure = make_job(old, status="failed", finished=old + timedelta(minutes=1))
    done = make_job(old, status="succeeded", finished=old + timedelta(minutes=1))
    [period] = [p for p in event_partitions() if p.low <= done.pk < p.high]

    result = Reaper(ReaperConfig(retention_days=7, retention_batch_size=100)).run_once()

    assert result.errors == 0
    # RETENTION_DAYS (7) alone would have dropped it, and the failure's timeline with it.
    assert period.name in names()
    assert partition_of(kept_failure) == {period.name}
    assert JobEvent.objects.filter(job_id=kept_failure.pk).count() == 3
    # The success (1 day) is gone on time, its events deleted from the partition.
    assert not Job.objects.filter(pk=done.pk).exists()
    assert not JobEvent.objects.filter(job_id=done.pk).exists()
