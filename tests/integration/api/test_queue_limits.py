"""PATCH /queues/<name>: a queue's concurrency cap and rate limit, checked, permitted, audited."""

from __future__ import annotations

import pytest

from jobs.models import OperatorAction, Queue
from tests.factories import queued

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def limits(name: str) -> tuple[int | None, float | None]:
    return Queue.objects.values_list("concurrency_cap", "rate_limit_per_second").get(name=name)


def test_patch_sets_both_limits_and_answers_the_queue(operator):
    queued(queue="emails")
    response = operator.request(
        "PATCH", "/queues/emails", {"rate_limit_per_second": 5, "concurrency_cap": 10}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["name"], body["rate_limit_per_second"], body["concurrency_cap"]) == (
        "emails",
        5.0,
        10,
    )
    assert body["counts"]["queued"] == 1
    assert limits("emails") == (10, 5.0)
    # GET /queues and /queues/<name> carry the rate limit too.
    listed = {q["name"]: q for q in operator.get("/queues").json()}
    assert listed["emails"]["rate_limit_per_second"] == 5.0
    assert operator.get("/queues/emails/").json()["rate_limit_per_second"] == 5.0


def test_a_field_left_out_keeps_its_value_and_null_clears(operator):
    Queue.objects.create(name="emails", concurrency_cap=3, rate_limit_per_second=2)
    assert (
        operator.request("PATCH", "/queues/emails", {"rate_limit_per_second": 0.5}).status_code
        == 200
    )
    assert limits("emails") == (3, 0.5)
    assert (
        operator.request("PATCH", "/queues/emails/", {"concurrency_cap": None}).status_code == 200
    )
    assert limits("emails") == (None, 0.5)
    response = operator.request("PATCH", "/queues/emails", {"rate_limit_per_second": None})
    assert response.json()["rate_limit_per_second"] is None
    assert limits("emails") == (None, None)


def test_a_queue_nobody_used_yet_gets_its_row(operator):
    response = operator.request("PATCH", "/queues/fresh", {"rate_limit_per_second": 1})
    assert response.status_code == 200
    assert Queue.objects.get(name="fresh").kind == "job"


def test_each_change_is_an_operator_action_of_its_caller(operator):
    operator.request("PATCH", "/queues/emails", {"rate_limit_per_second": 5, "concurrency_cap": 2})
    rows = list(OperatorAction.objects.order_by("id").values_list("action", "target", "filter"))
    assert rows == [
        ("set_cap", "emails", {"concurrency_cap": 2}),
        ("set_rate_limit", "emails", {"rate_limit_per_second": 5.0}),
    ]
    assert set(OperatorAction.objects.values_list("username", flat=True)) == {"operator"}


@pytest.mark.parametrize(
    "body, field, says",
    [
        ({"rate_limit_per_second": 0}, "rate_limit_per_second", "above 0"),
        ({"rate_limit_per_second": -2}, "rate_limit_per_second", "above 0"),
        ({"rate_limit_per_second": "5"}, "rate_limit_per_second", "above 0"),
        ({"rate_limit_per_second": True}, "rate_limit_per_second", "above 0"),
        ({"rate_limit_per_second": 1e300}, "rate_limit_per_second", "at most 1,000,000"),
        ({"concurrency_cap": 0}, "concurrency_cap", "whole number from 1"),
        ({"concurrency_cap": 2.5}, "concurrency_cap", "whole number from 1"),
        ({"concurrency_cap": "3"}, "concurrency_cap", "whole number from 1"),
        ({"rate": 5}, "rate", "not known"),
        ({}, "non_field_errors", "Give concurrency_cap, rate_limit_per_second"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field_and_change_nothing(operator, body, field, says):
    Queue.objects.create(name="emails", concurrency_cap=4, rate_limit_per_second=3)
    errors = assert_error_shape(operator.request("PATCH", "/queues/emails", body), 400)["errors"]
    assert says in errors[field][0]
    assert limits("emails") == (4, 3.0)
    assert not OperatorAction.objects.exists()


@pytest.mark.parametrize("raw", ["[1, 2]", "5", "null", '{"rate_limit_per_second": NaN}', "{"])
def test_bodies_that_are_not_an_object_are_a_400(operator, raw):
    assert_error_shape(operator.request("PATCH", "/queues/emails", raw=raw), 400)
    assert not Queue.objects.exists()


def test_one_bad_field_refuses_the_good_one_too(operator):
    body = {"concurrency_cap": 4, "rate_limit_per_second": -1}
    assert_error_shape(operator.request("PATCH", "/queues/emails", body), 400)
    assert not Queue.objects.exists()


def test_a_batch_queue_takes_no_rate_limit(operator):
    errors = assert_error_shape(
        operator.request("PATCH", "/queues/images.batch", {"rate_limit_per_second": 5}), 400
    )["errors"]
    assert "batch queue" in errors["rate_limit_per_second"][0]


def test_a_bad_queue_name_is_a_400(operator):
    assert_error_shape(operator.request("PATCH", "/queues/%20", {"concurrency_cap": 1}), 400)


@pytest.mark.parametrize("role, status", [("anonymous", 401), ("viewer", 403), ("remote", 403)])
def test_only_callers_who_may_change_jobs_set_limits(api_for, role, status):
    response = api_for(role).request("PATCH", "/queues/emails", {"rate_limit_per_second": 5})
    assert_error_shape(response, status)
    assert not Queue.objects.exists() and not OperatorAction.objects.exists()


def test_an_admin_may(admin):
    assert admin.request("PATCH", "/queues/emails", {"concurrency_cap": 7}).status_code == 200
    assert limits("emails") == (7, None)
