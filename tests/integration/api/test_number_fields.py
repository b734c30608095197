"""Numbers where numbers are due: no 500 for a huge rate limit, no string or boolean interval."""

from __future__ import annotations

import pytest

from jobs.models import Queue, Schedule

from .conftest import Api, assert_error_shape

pytestmark = pytest.mark.django_db

HUGE = "1" + "0" * 400  # a JSON integer Python cannot turn into a float


def test_a_rate_limit_too_large_for_a_float_is_a_400(operator: Api) -> None:
    raw = f'{{"rate_limit_per_second": {HUGE}}}'
    error = assert_error_shape(operator.request("PATCH", "/queues/huge", raw=raw), 400)
    assert "rate_limit_per_second" in error["errors"]
    assert not Queue.objects.filter(name="huge").exists()


@pytest.mark.parametrize("value", [True, "3600", HUGE], ids=["true", "string", "huge"])
def test_every_seconds_must_be_a_json_number(operator: Api, value) -> None:
    if value == HUGE:
        raw = f'{{"operation": "ping", "every_seconds": {HUGE}}}'
        response = operator.request("POST", "/schedules", raw=raw)
    else:
        response = operator.post("/schedules", {"operation": "ping", "every_seconds": value})
    error = assert_error_shape(response, 400)
    assert "every_seconds" in error["errors"]
    assert not Schedule.objects.exists()
