"""Remote claims share a rate-limited queue's bucket; a long-poll waits for the next token."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Queue

from .helpers import ECHO, register

pytestmark = pytest.mark.django_db(transaction=True)


def claim(api: httpx.Client, worker_id: str, **body) -> list[dict]:
    response = api.post(f"/workers/{worker_id}/claim", json=body)
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def test_a_long_poll_on_an_empty_bucket_answers_when_the_next_token_is_due(api, server):
    Queue.objects.create(name=ECHO["queue"], rate_limit_per_second=2)
    worker = register(api, concurrency=10)
    enqueue_many([JobSpec("remote.echo", {"text": str(n)}) for n in range(8)])
    assert len(claim(api, worker["id"], limit=10)) == 2  # a full bucket: one second's worth
    assert claim(api, worker["id"], limit=10) == []  # empty now, and not asked again

    started = time.monotonic()
    jobs = claim(api, worker["id"], limit=10, wait=10)
    took = time.monotonic() - started
    assert len(jobs) == 1  # the next token, 0.5 s after the burst
    assert 0.2 < took < 3, took


def test_wake_ups_on_an_empty_bucket_do_not_start_more_jobs(api, server):
    """Jobs enqueued while the claim is parked wake it (NOTIFY, or SQLite's poll); the
    bucket still decides when the next one starts."""
    Queue.objects.create(name=ECHO["queue"], rate_limit_per_second=1)
    worker = register(api, concurrency=10)
    enqueue("remote.echo", {"text": "first"})
    assert len(claim(api, worker["id"], limit=10)) == 1
    got: dict = {}

    def poll() -> None:
        started = time.monotonic()
        got["jobs"] = claim(api, worker["id"], limit=10, wait=10)
        got["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    for n in range(5):
        time.sleep(0.1)
        enqueue("remote.echo", {"text": str(n)})
    thread.join(timeout=15)
    assert len(got["jobs"]) == 1, got
    assert 0.5 < got["seconds"] < 3, got
