"""Remote workers obey keyed limits through their claim: two workers registered over HTTP
(``POST /workers``) share a key's concurrency of 1 through a real daphne server.

On PostgreSQL and SQLite.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from django.db import connection

from jobs import events
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent
from jobs.operator_actions import set_key_limits
from tests.conftest import wait_for
from tests.integration.flow_keys.conftest import max_overlap_by_key, runs_of
from tests.integration.remote.helpers import ECHO, register

pytestmark = pytest.mark.django_db(transaction=True)

OPERATION = ECHO["name"]


@pytest.fixture
def queue() -> str:
    """A queue of this test's own: this process remembers which queues it marked keyed
    (``jobs.fair_turns``), and the flush between tests forgets their rows."""
    return f"keyed-remote-{uuid.uuid4().hex[:6]}"


def register_on(api: httpx.Client, queue: str, concurrency: int) -> dict:
    return register(api, operations=[{**ECHO, "queue": queue}], concurrency=concurrency)


def claim(api: httpx.Client, worker: dict, **body: Any) -> list[dict]:
    response = api.post(f"/workers/{worker['id']}/claim", json=body)
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def complete(api: httpx.Client, job: dict) -> None:
    response = api.post(
        f"/jobs/{job['id']}/complete", json={"lease_token": job["lease_token"], "result": None}
    )
    assert response.status_code == 200, response.text


def keys_of(job: dict) -> list[str]:
    return Job.objects.values_list("flow_keys", flat=True).get(pk=job["id"])


def test_two_remote_workers_hold_one_job_of_a_key_at_a_time(remote_api, queue):
    set_key_limits("solo", {"concurrency": 1})
    first = register_on(remote_api, queue, concurrency=10)
    second = register_on(remote_api, queue, concurrency=10)
    enqueue_many(
        [JobSpec(OPERATION, {"text": str(n)}, keys=["solo:1"], queue=queue) for n in range(3)]
    )

    held = claim(remote_api, first, limit=10)
    assert len(held) == 1 and keys_of(held[0]) == ["solo:1"]
    assert claim(remote_api, second, limit=10) == []  # the key is at its limit, 1/1
    other = enqueue(OPERATION, {"text": "other"}, queue=queue, keys=["other:1"])
    got = claim(remote_api, second, limit=10)
    assert [job["id"] for job in got] == [str(other.pk)]  # another key's job, and only it
    assert claim(remote_api, first, limit=10) == []
    assert claim(remote_api, second, limit=10) == []

    # The holder completes: the key has room again, for whichever worker asks first.
    complete(remote_api, held[0])
    nxt = claim(remote_api, second, limit=10)
    assert len(nxt) == 1 and keys_of(nxt[0]) == ["solo:1"]
    assert claim(remote_api, first, limit=10) == []
    running = Job.objects.filter(status="running").values_list("flow_keys", flat=True)
    assert sorted(k for keys in running for k in keys) == ["other:1", "solo:1"]


def test_a_parked_claim_gets_the_keys_next_job_when_the_holder_completes(remote_api, queue):
    """A claim parked while the key is at its limit gets the key's next job soon after the
    holder completes, not when its wait is up."""
    set_key_limits("solo", {"concurrency": 1})
    first = register_on(remote_api, queue, concurrency=10)
    second = register_on(remote_api, queue, concurrency=10)
    enqueue_many(
        [JobSpec(OPERATION, {"text": str(n)}, keys=["solo:1"], queue=queue) for n in range(2)]
    )
    held = claim(remote_api, first, limit=10)
    assert len(held) == 1
    got: dict[str, Any] = {}

    def park() -> None:
        with httpx.Client(
            base_url=remote_api.base_url, headers=remote_api.headers, timeout=40, trust_env=False
        ) as api:
            started = time.monotonic()
            got["jobs"] = claim(api, second, limit=10, wait=8)
            got["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=park)
    thread.start()
    time.sleep(0.5)  # parked, the key at its limit
    assert "jobs" not in got
    completed_at = time.monotonic()
    complete(remote_api, held[0])
    thread.join(timeout=15)
    assert len(got["jobs"]) == 1, got
    waited = time.monotonic() - completed_at
    print(f"parked claim answered {waited:.2f} s after the completion")
    assert waited < 4, waited


SOLO_JOBS, OTHER_JOBS = 30, 10


def test_concurrent_remote_claims_never_run_two_jobs_of_a_key_of_one(remote_api, queue):
    """Two remote workers claim, hold and complete as fast as they can, each from its own
    thread; the events show one ``solo:1`` run at a time, and every job succeeded once."""
    set_key_limits("solo", {"concurrency": 1})
    workers = [register_on(remote_api, queue, concurrency=4) for _ in range(2)]
    specs = [
        JobSpec(OPERATION, {"text": f"s{n}"}, keys=["solo:1"], queue=queue)
        for n in range(SOLO_JOBS)
    ]
    specs += [
        JobSpec(OPERATION, {"text": f"o{n}"}, keys=[f"other:{n}"], queue=queue)
        for n in range(OTHER_JOBS)
    ]
    ids = [job.pk for job in enqueue_many(specs)]
    errors: list[BaseException] = []
    done = threading.Event()
    served: Counter[str] = Counter()
    barrier = threading.Barrier(len(workers))

    def serve(worker: dict, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with httpx.Client(
                base_url=remote_api.base_url,
                headers=remote_api.headers,
                timeout=40,
                trust_env=False,
            ) as api:
                barrier.wait(timeout=10)
                deadline = time.monotonic() + 25
                while not done.is_set() and time.monotonic() < deadline:
                    for job in claim(api, worker, limit=4):
                        time.sleep(rng.uniform(0.0, 0.03))
                        complete(api, job)
                        served[worker["id"]] += 1
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
            done.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=serve, args=(w, n)) for n, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done.is_set():
            if not Job.objects.filter(pk__in=ids).exclude(status="succeeded").exists():
                break
            time.sleep(0.05)
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors

    succeeded = Counter(
        JobEvent.objects.filter(job_id__in=ids, event=events.JOB_SUCCEEDED).values_list(
            "job_id", flat=True
        )
    )
    assert set(succeeded) == set(ids) and set(succeeded.values()) == {1}
    runs = runs_of(ids)
    assert len(runs) == len(ids)  # none ran twice
    overlap = max_overlap_by_key(runs)
    print(f"solo:1 at most {overlap['solo:1']} at once; served by worker: {dict(served)}")
    assert overlap["solo:1"] == 1, overlap
    assert len(served) == 2, served  # both workers took part


def test_a_holder_that_disconnects_or_goes_silent_frees_the_key_for_the_other(
    remote_api, queue, start_process
):
    """The key's slot comes back when its holder leaves (``DELETE /workers/<id>``: the job
    is requeued) or falls silent (the reaper rescues its job): the other worker gets it."""
    set_key_limits("solo", {"concurrency": 1})
    leaving, silent, staying = (register_on(remote_api, queue, concurrency=4) for _ in range(3))
    enqueue_many(
        [JobSpec(OPERATION, {"text": str(n)}, keys=["solo:1"], queue=queue) for n in range(2)]
    )
    held = claim(remote_api, leaving, limit=4)
    assert len(held) == 1 and claim(remote_api, staying, limit=4) == []
    assert remote_api.delete(f"/workers/{leaving['id']}").status_code in (200, 204)
    again = claim(remote_api, staying, limit=4)
    assert [job["id"] for job in again] == [held[0]["id"]]  # the same job, requeued
    complete(remote_api, again[0])

    held = claim(remote_api, silent, limit=4)
    assert len(held) == 1 and claim(remote_api, staying, limit=4) == []
    reaper = start_process("reaper", "--interval", "0.2")
    got: list[dict] = []

    def staying_gets_it() -> bool:
        # Only the staying worker heartbeats: the silent one's heartbeat ages.
        beat = remote_api.patch(f"/workers/{staying['id']}", json={})
        assert beat.status_code == 200, beat.text
        got.extend(claim(remote_api, staying, limit=4))
        return bool(got)

    wait_for(staying_gets_it, timeout=20, interval=0.2, message="the silent holder's job rescued")
    assert [job["id"] for job in got] == [held[0]["id"]]
    stale = remote_api.post(
        f"/jobs/{held[0]['id']}/complete", json={"lease_token": held[0]["lease_token"]}
    )
    assert stale.status_code == 409  # the silent holder lost it: fenced off
    complete(remote_api, got[0])
    runs = runs_of([job["id"] for job in got])
    assert [run.end_event for run in runs].count(events.JOB_LEASE_EXPIRED_REQUEUE) == 1
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0, reaper.output()


LOCAL_JOBS = REMOTE_JOBS = 15


def test_a_local_and_a_remote_worker_share_one_key(remote_api, queue, worker):
    """One key of concurrency 1 over a ``runworker`` process (the key's ``sleep`` jobs) and a
    remote worker (its ``remote.echo`` jobs): one run of the key at a time across both."""
    set_key_limits("solo", {"concurrency": 1})
    remote = register_on(remote_api, queue, concurrency=4)
    nap = {"seconds": 0.03, "emit_every": 1}
    specs = [JobSpec("sleep", nap, queue=queue, keys=["solo:1"]) for _ in range(LOCAL_JOBS)]
    specs += [
        JobSpec(OPERATION, {"text": str(n)}, queue=queue, keys=["solo:1"])
        for n in range(REMOTE_JOBS)
    ]
    ids = [job.pk for job in enqueue_many(specs)]
    local = worker(queue, args=("--concurrency", "4"))
    deadline = time.monotonic() + 30
    remote_runs = 0
    while time.monotonic() < deadline and remote_runs < REMOTE_JOBS:
        for job in claim(remote_api, remote, limit=4, wait=1):
            time.sleep(0.03)
            complete(remote_api, job)
            remote_runs += 1
    wait_for(
        lambda: (
            JobEvent.objects.filter(job_id__in=ids, event=events.JOB_SUCCEEDED).count() >= len(ids)
        ),
        timeout=30,
        message="every job succeeded",
    )
    assert local.popen.poll() is None, local.output()
    runs = runs_of(ids)
    assert len(runs) == len(ids)
    overlap = max_overlap_by_key(runs)
    by_worker = Counter(
        JobEvent.objects.filter(job_id__in=ids, event=events.JOB_STARTED).values_list(
            "fields__worker", flat=True
        )
    )
    print(f"local and remote: solo:1 at most {overlap['solo:1']} at once; {dict(by_worker)}")
    assert overlap["solo:1"] == 1, overlap
    assert len(by_worker) == 2, by_worker
