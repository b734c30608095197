"""Schedule tests' fixtures: the API clients of tests/integration/api, a schedule maker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobs.models import Schedule, ScheduleFire
from jobs.schedules.services import create_schedule
from tests.factories import unique_queue
from tests.integration.api.conftest import admin, api_for, operator, viewer  # noqa: F401


@pytest.fixture
def make_schedule(db) -> Callable[..., Schedule]:
    """``make_schedule(every_seconds=60, ...)``: a ``ping`` schedule on a queue of its own."""

    def make(**values: Any) -> Schedule:
        values.setdefault("operation", "ping")
        values.setdefault("queue", unique_queue())
        if "cron" not in values:
            values.setdefault("every_seconds", 60)
        return create_schedule(values)

    return make


def fires(schedule: Schedule) -> list[tuple[Any, str, Any]]:
    """(fire_at, outcome, job id) of every fire, oldest first."""
    return list(
        ScheduleFire.objects.filter(schedule=schedule)
        .order_by("fire_at")
        .values_list("fire_at", "outcome", "job_id")
    )
