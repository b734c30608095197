"""Retention by status and by queue (jobs.retention): a reaper pass deletes each finished job
by the retention of its queue and status, on PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone

from jobs.models import Job, JobEvent, OperatorAction
from jobs.operator_actions import set_queue_retention
from jobs.retention import RetentionError, current_retention
from tests.factories import cancelled, failed, make_user, succeeded, unique_queue
from workers.config import ReaperConfig
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)

RULES = {
    "RETENTION_DAYS": 7,
    "RETENTION_DAYS_BY_STATUS": {"succeeded": 1, "failed": 30},
}


def finished(make, queue: str, days_ago: float) -> Job:
    job = make(queue=queue)
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days_ago))
    return job


def reap() -> int:
    config = ReaperConfig(retention_days=7, retention_batch_size=100)
    result = Reaper(config).run_once()
    assert result.errors == 0
    return result.jobs_deleted


def kept(*jobs: Job) -> set[str]:
    return {
        str(pk)
        for pk in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", flat=True)
    }


def test_each_finished_job_goes_by_its_status_and_its_queues_retention():
    plain, reports = unique_queue("plain"), unique_queue("reports")
    with override_settings(
        CONTROLPLANE={**RULES, "QUEUE_RETENTION_DAYS": {reports: {"succeeded": 0.5}}}
    ):
        gone = [
            finished(succeeded, plain, 2),  # succeeded: 1 day
            finished(failed, plain, 40),  # failed: 30 days
            finished(cancelled, plain, 8),  # no status rule: RETENTION_DAYS
            finished(succeeded, reports, 0.6),  # the queue's 0.5 day
        ]
        stay = [
            finished(succeeded, plain, 0.6),
            finished(failed, plain, 10),
            finished(cancelled, plain, 6),
            finished(succeeded, reports, 0.3),
            finished(failed, reports, 10),  # the queue names succeeded only: status rule
        ]
        assert reap() == len(gone)
    assert kept(*gone) == set()
    assert not JobEvent.objects.filter(job_id__in=[j.pk for j in gone]).exists()
    assert kept(*stay) == {str(j.pk) for j in stay}


def test_an_operators_queue_retention_wins_over_the_settings_and_is_audited():
    operator_user = make_user("operator")
    queue = unique_queue("ops")
    with override_settings(CONTROLPLANE={**RULES, "QUEUE_RETENTION_DAYS": {queue: 1}}):
        set_queue_retention(queue, {"failed": 2, "succeeded": 10}, user=operator_user)
        rules = current_retention(7)
        assert rules.explain(queue, "failed") == (2.0, "queue")
        assert rules.explain(queue, "cancelled") == (1.0, "settings")
        assert rules.longest == 30.0
        old_failure = finished(failed, queue, 3)
        recent_failure = finished(failed, queue, 1)
        kept_success = finished(succeeded, queue, 5)  # 10 days here, 1 by its status elsewhere
        old_cancel = finished(cancelled, queue, 1.5)
        assert reap() == 2
    assert kept(old_failure, recent_failure, kept_success, old_cancel) == {
        str(recent_failure.pk),
        str(kept_success.pk),
    }
    action = OperatorAction.objects.get(action="set_retention", target=queue)
    assert action.username == operator_user.username
    assert action.filter == {"retention_days": {"failed": 2.0, "succeeded": 10.0}}


def test_clearing_a_queues_retention_returns_it_to_the_settings():
    queue = unique_queue("clear")
    set_queue_retention(queue, 3)
    assert current_retention(7).explain(queue, "succeeded") == (3.0, "queue")
    set_queue_retention(queue, None)
    assert current_retention(7).explain(queue, "succeeded") == (7.0, "default")


@pytest.mark.parametrize("value", [-1, "soon", {"finished": 1}, {"failed": float("nan")}, True])
def test_a_retention_outside_its_rules_is_refused_and_nothing_changes(value):
    queue = unique_queue("bad")
    with pytest.raises(RetentionError):
        set_queue_retention(queue, value)
    assert not OperatorAction.objects.filter(target=queue).exists()


def test_bad_retention_settings_say_what_to_fix():
    with override_settings(CONTROLPLANE={"RETENTION_DAYS_BY_STATUS": {"done": 1}}):
        with pytest.raises(ImproperlyConfigured, match="RETENTION_DAYS_BY_STATUS"):
            current_retention()
    with override_settings(CONTROLPLANE={"QUEUE_RETENTION_DAYS": {"reports": {"failed": -2}}}):
        with pytest.raises(ImproperlyConfigured, match="reports"):
            current_retention()
