"""The queues page's rate limit: set and clear it next to the cap, operators only, audited."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import OperatorAction, Queue
from tests.factories import make_user, queued
from tests.integration.dashboard.test_dash_actions import messages_of

RATE = "/dashboard/queues/rate/"


def rate_of(name: str) -> float | None:
    return Queue.objects.values_list("rate_limit_per_second", flat=True).get(name=name)


def test_an_operator_sets_and_clears_a_rate_limit(operator_client: Client) -> None:
    job = queued(queue="emails")
    response = operator_client.post(
        RATE, {"name": job.queue, "rate_limit_per_second": "2.5"}, follow=True
    )
    assert rate_of("emails") == 2.5
    assert "starts at most 2.5 jobs a second" in messages_of(response)
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert 'name="rate_limit_per_second"' in html and 'value="2.5"' in html
    assert "Rate limit" in html and "2.5 jobs/s" in html  # the audit table names it

    response = operator_client.post(
        RATE, {"name": "emails", "rate_limit_per_second": ""}, follow=True
    )
    assert rate_of("emails") is None
    assert "no rate limit now" in messages_of(response)
    actions = OperatorAction.objects.filter(action="set_rate_limit").order_by("id")
    assert [(a.target, a.filter) for a in actions] == [
        ("emails", {"rate_limit_per_second": 2.5}),
        ("emails", {"rate_limit_per_second": None}),
    ]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "2000000"])
def test_a_bad_rate_is_refused_and_changes_nothing(operator_client: Client, value: str) -> None:
    Queue.objects.create(name="emails", rate_limit_per_second=4)
    response = operator_client.post(
        RATE, {"name": "emails", "rate_limit_per_second": value}, follow=True
    )
    assert "above 0" in messages_of(response)
    assert rate_of("emails") == 4
    assert not OperatorAction.objects.exists()


def test_a_viewer_sees_the_limit_but_cannot_set_it(viewer_client: Client) -> None:
    Queue.objects.create(name="emails", rate_limit_per_second=5)
    html = viewer_client.get("/dashboard/queues/").content.decode()
    assert "5/s" in html and 'name="rate_limit_per_second"' not in html
    response = viewer_client.post(RATE, {"name": "emails", "rate_limit_per_second": "50"})
    assert response.status_code == 403
    assert rate_of("emails") == 5


def test_a_batch_queue_has_no_rate_form(operator_client: Client) -> None:
    queued(queue="images.batch")
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert 'aria-label="Rate limit of images.batch' not in html
    assert 'aria-label="Concurrency cap of images.batch"' in html


@pytest.mark.django_db
def test_setting_a_rate_needs_a_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    queued(queue="emails")
    assert client.post(RATE, {"name": "emails", "rate_limit_per_second": "3"}).status_code == 403
    assert not Queue.objects.filter(name="emails").exists()
    token = client.get("/dashboard/queues/").context["csrf_token"]
    response = client.post(
        RATE, {"name": "emails", "rate_limit_per_second": "3", "csrfmiddlewaretoken": str(token)}
    )
    assert response.status_code == 302 and rate_of("emails") == 3
