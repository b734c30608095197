"""A process's reading of the database's clock lags it by up to the reading's round trip.

Rows the database stamps itself (a requeue's ``run_after``) then look a little in the
future to that reading; the remote claim compares in the statement, so it hands such a
job out at once instead of answering "nothing to do" until the lag has passed.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models.functions import Now

from jobs.models import Job
from tests.factories import queued

from .conftest import register_worker

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="SQLite is one machine: its clock is ours"
    ),
]


def test_a_job_the_database_made_due_is_claimed_at_once(admin, lagging_clock_reading):
    worker_id = register_worker(admin)
    job = queued(queue="default")
    Job.objects.filter(pk=job.pk).update(run_after=Now())  # as a requeue stamps it
    response = admin.post(f"/workers/{worker_id}/claim", {"limit": 1})
    assert response.status_code == 200, response.content
    assert [j["id"] for j in response.json()["jobs"]] == [str(job.pk)]
