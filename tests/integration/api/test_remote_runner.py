"""A remote claim records the remote worker's own host and pid on ``job.started``."""

from __future__ import annotations

import pytest

from jobs.models import JobEvent

from .conftest import Api

pytestmark = pytest.mark.django_db


def test_a_remote_claim_names_the_registered_host_and_pid(api_for) -> None:
    remote: Api = api_for("remote")
    from tests.factories import queued

    response = remote.post(
        "/workers",
        {"name": "w", "operations": ["ping"], "hostname": "builder-7", "pid": 4242},
    )
    assert response.status_code == 201, response.content
    job = queued(queue="default")

    claimed = remote.post(f"/workers/{response.json()['id']}/claim", {"limit": 1})

    assert claimed.status_code == 200, claimed.content
    fields = JobEvent.objects.get(job_id=job.pk, event="job.started").fields
    assert (fields["host"], fields["pid"]) == ("builder-7", 4242)
    assert fields["worker"] == response.json()["id"]
