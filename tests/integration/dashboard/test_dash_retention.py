"""The queues page's retention: shown per status with its source, set by operators, audited."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from jobs.models import OperatorAction, Queue
from tests.factories import queued
from tests.integration.dashboard.test_dash_actions import messages_of

RETENTION = "/dashboard/queues/retention/"


def retention_of(name: str) -> dict | None:
    return Queue.objects.values_list("retention_days", flat=True).get(name=name)


@override_settings(CONTROLPLANE={"RETENTION_DAYS": 7, "RETENTION_DAYS_BY_STATUS": {"failed": 30}})
def test_an_operator_sets_and_clears_a_queues_retention(operator_client: Client) -> None:
    job = queued(queue="reports")
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert 'succeeded <span data-retention-status="succeeded">7</span> d (default)' in html
    assert 'failed <span data-retention-status="failed">30</span> d (status)' in html

    response = operator_client.post(
        RETENTION,
        {
            "name": job.queue,
            "retention_succeeded": "0.5",
            "retention_failed": "",
            "retention_cancelled": "",
        },
        follow=True,
    )
    assert retention_of("reports") == {"succeeded": 0.5}
    assert "keeps finished jobs: succeeded 0.5 d" in messages_of(response)
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert 'succeeded <span data-retention-status="succeeded">0.5</span> d (queue)' in html
    assert 'name="retention_succeeded"' in html and 'value="0.5"' in html
    assert "Retention" in html and "succeeded 0.5 d" in html  # the audit table names it

    response = operator_client.post(RETENTION, {"name": "reports"}, follow=True)
    assert retention_of("reports") is None
    assert "follows the settings' retention" in messages_of(response)
    actions = OperatorAction.objects.filter(action="set_retention").order_by("id")
    assert [(a.target, a.filter, a.username) for a in actions] == [
        ("reports", {"retention_days": {"succeeded": 0.5}}, actions[0].user.username),
        ("reports", {"retention_days": None}, actions[1].user.username),
    ]


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", "99999999"])
def test_a_bad_retention_is_refused_and_changes_nothing(
    operator_client: Client, value: str
) -> None:
    Queue.objects.create(name="reports", retention_days={"failed": 3})
    response = operator_client.post(
        RETENTION, {"name": "reports", "retention_failed": value}, follow=True
    )
    assert "number of days from 0" in messages_of(response)
    assert retention_of("reports") == {"failed": 3}
    assert not OperatorAction.objects.exists()


def test_a_viewer_sees_the_retention_but_cannot_set_it(viewer_client: Client) -> None:
    Queue.objects.create(name="reports", retention_days={"failed": 3})
    queued(queue="reports")
    html = viewer_client.get("/dashboard/queues/").content.decode()
    assert 'failed <span data-retention-status="failed">3</span> d (queue)' in html
    assert 'name="retention_failed"' not in html
    response = viewer_client.post(RETENTION, {"name": "reports", "retention_failed": "50"})
    assert response.status_code == 403
    assert retention_of("reports") == {"failed": 3}
