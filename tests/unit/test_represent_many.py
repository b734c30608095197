"""``represent_many`` (django_controlplane.api.serializers): the same JSON as DRF's own
``serializer(instance).data``."""

from __future__ import annotations

import uuid
import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from django_controlplane.api.serializers import (
    EnqueuedJobSerializer,
    JobDetailSerializer,
    JobSerializer,
    QueueSerializer,
    represent,
    represent_many,
)
from jobs.models import Job


def _jobs() -> list[Job]:
    """Jobs with every field of the JSON null in one and set in another, odd values included."""
    now = datetime(2026, 11, 27, 1, 2, 3, 456789, tzinfo=UTC)
    bare = Job(id=uuid.uuid4(), operation="ping", queue="q", payload={}, created_at=now)
    whole_second = now.replace(microsecond=0)
    full = Job(
        id=uuid.uuid4(),
        operation="billing.charge",
        queue="emails",
        status="failed",
        priority=-7,
        payload={"a": [1, 2.5, None, True], "b": {"c": "ü\n\"'"}},
        result={"ok": False},
        error_code="Boom",
        error_message="line one\nline two \u2028",
        attempts=3,
        max_attempts=5,
        parent_id=uuid.uuid4(),
        progress_current=4,
        progress_total=10,
        created_at=whole_second,
        run_after=now + timedelta(days=400),
        started_at=now - timedelta(hours=5),
        finished_at=now,
        leased_until=now + timedelta(seconds=30),
        worker_id=uuid.uuid4(),
        expires_at=datetime(2027, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        unique_key="key-1",
        unique_while="until_retention",
        timeout_seconds=2.5,
        schedule_id=uuid.uuid4(),
    )
    active = Job(
        id=uuid.uuid4(),
        operation="x",
        queue="q",
        payload={"n": 1},
        unique_key="key-2",
        unique_while="active",
        timeout_seconds=3.0,
        created_at=now,
    )
    return [bare, full, active]


def _drf(serializer_class: type[serializers.Serializer], instance: Any) -> dict[str, Any]:
    return dict(serializer_class(instance).data)


@pytest.mark.parametrize("serializer_class", [JobSerializer, EnqueuedJobSerializer])
def test_the_same_json_as_drf(serializer_class):
    jobs = _jobs()
    jobs[1].duplicate = True
    assert represent_many(serializer_class, jobs) == [_drf(serializer_class, j) for j in jobs]
    for job in jobs:
        assert represent(serializer_class, job) == _drf(serializer_class, job)


def test_a_nested_serializer_field_is_represented_by_drf():
    job = _jobs()[1]
    job.children_counts = {"queued": 1, "running": 0, "succeeded": 2, "failed": 0, "cancelled": 0}
    assert represent(JobDetailSerializer, job) == _drf(JobDetailSerializer, job)


def test_datetimes_follow_the_active_time_zone(settings):
    jobs = _jobs()
    with timezone.override(zoneinfo.ZoneInfo("America/New_York")):
        shown = represent_many(JobSerializer, jobs)
        assert shown == [_drf(JobSerializer, j) for j in jobs]
    assert shown[0]["created_at"].endswith("-05:00")
    settings.USE_TZ = False  # DRF then writes naive datetimes (in UTC): so does this
    naive = [_drf(JobSerializer, j) for j in jobs]
    assert represent_many(JobSerializer, jobs) == naive


def test_a_datetime_format_other_than_iso_8601_is_drfs(settings):
    jobs = _jobs()
    settings.REST_FRAMEWORK = {
        **getattr(settings, "REST_FRAMEWORK", {}),
        "DATETIME_FORMAT": "%d/%m/%Y %H:%M",
    }
    shown = represent_many(JobSerializer, jobs)
    assert shown == [_drf(JobSerializer, j) for j in jobs]
    assert shown[1]["finished_at"] == "27/11/2026 01:02"


def test_a_value_the_fast_path_does_not_know_gets_drfs_answer():
    job = _jobs()[0]
    job.created_at = datetime(2026, 1, 1, 12, 0)  # naive: DRF makes it aware
    job.priority = "3"  # DRF's IntegerField: int("3")
    assert represent(JobSerializer, job) == _drf(JobSerializer, job)
    assert represent(JobSerializer, job)["priority"] == 3


def test_drfs_error_for_a_value_it_cannot_represent():
    job = _jobs()[0]
    job.priority = "not a number"
    with pytest.raises(ValueError):
        JobSerializer(job).data  # noqa: B018
    with pytest.raises(ValueError):
        represent(JobSerializer, job)


def test_mappings_and_plain_serializers_are_represented_by_drf():
    queue = {
        "name": "q",
        "kind": "job",
        "counts": {"queued": 1, "running": 0, "succeeded": 0, "failed": 0, "cancelled": 0},
        "oldest_queued_age": None,
        "running": 0,
        "throughput": {"last_minute": 1, "last_hour": 2},
        "paused": False,
        "concurrency_cap": None,
        "rate_limit_per_second": 1.5,
        "pending_messages": 0,
    }
    assert represent_many(QueueSerializer, [queue]) == [dict(QueueSerializer(queue).data)]


def test_a_serializer_with_its_own_to_representation_keeps_it():
    class Shouting(JobSerializer):
        def to_representation(self, instance: Any) -> Any:
            out = super().to_representation(instance)
            out["operation"] = out["operation"].upper()
            return out

    job = _jobs()[0]
    assert represent(Shouting, job)["operation"] == "PING"
