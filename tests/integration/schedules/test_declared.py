"""Schedules declared in code, ``@operation(schedule=...)`` and ``CONTROLPLANE["SCHEDULES"]``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import Schedule
from jobs.operations import operation, registry
from jobs.schedules.declared import sync_code_schedules
from jobs.schedules.services import create_schedule, pause_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def declared_operations():
    """Two operations with schedules beside them; unregistered afterwards."""
    operation("test.every_quarter", schedule="*/15 * * * *")(lambda ctx, payload: None)
    operation(
        "test.berlin_morning",
        queue="mornings",
        schedule={
            "name": "berlin-morning",
            "cron": "0 7 * * MON-FRI",
            "timezone": "Europe/Berlin",
            "payload": {"hello": "world"},
            "catch_up": "all",
            "priority": 7,
        },
    )(lambda ctx, payload: None)
    yield
    registry.unregister("test.every_quarter")
    registry.unregister("test.berlin_morning")


def test_decorated_operations_get_their_schedules(declared_operations):
    result = sync_code_schedules()
    assert (result.created, result.updated, result.deleted, result.invalid) == (2, 0, 0, 0)
    quarter = Schedule.objects.get(name="test.every_quarter")
    assert (quarter.source, quarter.operation, quarter.cron) == (
        "code",
        "test.every_quarter",
        "*/15 * * * *",
    )
    assert quarter.next_fire_at.minute % 15 == 0
    morning = Schedule.objects.get(name="berlin-morning")
    assert (morning.timezone, morning.payload, morning.catch_up, morning.priority) == (
        "Europe/Berlin",
        {"hello": "world"},
        "all",
        7,
    )
    assert morning.queue is None  # the operation's own queue applies at enqueue
    # A second sync changes nothing.
    assert sync_code_schedules().created == sync_code_schedules().updated == 0


def test_settings_schedules_are_created_updated_and_deleted(settings):
    entry = {"name": "tidy", "operation": "ping", "every_seconds": 600, "catch_up": "none"}
    settings.CONTROLPLANE = {"SCHEDULES": [entry]}
    assert sync_code_schedules().created == 1
    tidy = Schedule.objects.get(name="tidy")
    pause_schedule(tidy.pk)
    # A changed interval fires from the next slot after now; the operator's pause stays.
    settings.CONTROLPLANE = {"SCHEDULES": [{**entry, "every_seconds": 60}]}
    now = timezone.now()
    assert sync_code_schedules(now).updated == 1
    tidy = Schedule.objects.get(name="tidy")
    assert tidy.every_seconds == 60 and tidy.paused
    assert now < tidy.next_fire_at <= now + timedelta(seconds=60)
    # Gone from the settings: deleted.
    settings.CONTROLPLANE = {"SCHEDULES": []}
    assert sync_code_schedules().deleted == 1
    assert not Schedule.objects.exists()


def test_bad_declarations_are_logged_and_leave_rows_alone(settings, caplog):
    ok = {"name": "ok", "operation": "ping", "cron": "0 * * * *"}
    settings.CONTROLPLANE = {"SCHEDULES": [ok]}
    sync_code_schedules()
    settings.CONTROLPLANE = {
        "SCHEDULES": [
            {"name": "ok", "operation": "ping", "cron": "0 99 * * *"},  # now broken
            {"name": "ghost", "operation": "no.such.operation", "every_seconds": 60},
            "not a dict",
        ]
    }
    result = sync_code_schedules()
    assert (result.invalid, result.deleted) == (3, 0)
    assert Schedule.objects.get(name="ok").cron == "0 * * * *"
    assert not Schedule.objects.filter(name="ghost").exists()
    assert "schedule.declaration_invalid" in caplog.text


def test_an_api_schedule_of_the_same_name_is_never_taken_over(settings, caplog):
    mine = create_schedule({"name": "shared", "operation": "ping", "every_seconds": 30})
    settings.CONTROLPLANE = {
        "SCHEDULES": [{"name": "shared", "operation": "ping", "cron": "0 * * * *"}]
    }
    result = sync_code_schedules()
    assert (result.created, result.updated) == (0, 0)
    kept = Schedule.objects.get(pk=mine.pk)
    assert (kept.source, kept.every_seconds, kept.cron) == ("api", 30.0, "")
    assert "schedule.name_taken" in caplog.text
    # Nor deleted as a code schedule that left the code.
    settings.CONTROLPLANE = {"SCHEDULES": []}
    sync_code_schedules()
    assert Schedule.objects.filter(pk=mine.pk).exists()
