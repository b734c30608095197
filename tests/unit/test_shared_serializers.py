"""``validated``/``represent`` (django_controlplane.api.serializers): one serializer instance
for every thread."""

from __future__ import annotations

import threading
import uuid

import pytest
from rest_framework.exceptions import ValidationError

from django_controlplane.api.serializers import (
    EnqueuedJobSerializer,
    EnqueueSerializer,
    JobSerializer,
    represent,
    validated,
)
from jobs.models import Job


def test_validated_answers_as_is_valid_does():
    body = {"operation": "ping", "priority": "x", "nonsense": 1}
    serializer = EnqueueSerializer(data=body)
    assert not serializer.is_valid()
    with pytest.raises(ValidationError) as refused:
        validated(EnqueueSerializer, body)
    assert refused.value.detail == serializer.errors
    good = {"operation": "ping", "queue": "q", "timeout_seconds": 3}
    serializer = EnqueueSerializer(data=good)
    assert serializer.is_valid()
    assert validated(EnqueueSerializer, good) == serializer.validated_data


def test_represent_answers_as_data_does():
    job = Job(id=uuid.uuid4(), operation="ping", queue="q", payload={"a": [1, 2]}, priority=3)
    job.duplicate = True
    assert represent(EnqueuedJobSerializer, job) == EnqueuedJobSerializer(job).data


def test_threads_at_once_each_get_their_own_answer():
    results: dict[int, object] = {}
    start = threading.Barrier(16)

    def work(n: int) -> None:
        start.wait(5)
        out = []
        for i in range(200):
            body = {"operation": f"op{n}", "priority": n * 1000 + i}
            if (n + i) % 5 == 0:
                body["priority"] = "not a number"
            try:
                out.append(("ok", validated(EnqueueSerializer, body)["priority"]))
            except ValidationError as error:
                out.append(("refused", sorted(error.detail)))
            job = Job(id=uuid.uuid4(), operation=f"op{n}", queue=f"q{n}", payload={"i": i})
            shown = represent(JobSerializer, job)
            out.append(("shown", (shown["operation"], shown["queue"], shown["payload"]["i"])))
        results[n] = out

    threads = [threading.Thread(target=work, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 16
    for n, out in results.items():
        for i in range(200):
            checked, shown = out[2 * i], out[2 * i + 1]
            if (n + i) % 5 == 0:
                assert checked == ("refused", ["priority"])
            else:
                assert checked == ("ok", n * 1000 + i)
            assert shown == ("shown", (f"op{n}", f"q{n}", i))
