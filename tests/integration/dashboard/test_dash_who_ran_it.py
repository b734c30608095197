"""The job page names the host and pid that ran a job whose worker is gone."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from tests.factories import running

pytestmark = pytest.mark.django_db


def test_a_gone_workers_job_shows_the_host_and_pid_from_its_started_event(viewer_client):
    job, _ = running(worker_id=uuid.uuid4())  # no Worker row: as after the worker stopped

    html = viewer_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()

    assert f"{socket.gethostname()}:{os.getpid()}" in html
    assert "(gone)" in html
