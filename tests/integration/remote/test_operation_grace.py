"""Remote-declared operations outlive their workers for REMOTE_OPERATION_GRACE_SECONDS.

A redeploy disconnects every worker of an operation before the new ones
register; ``POST /jobs`` must keep accepting it meanwhile, its jobs waiting
queued for the next worker. After the grace, enqueue refuses it and says
why. The server runs with the default grace (24 hours); "after the grace" is
reached by moving ``last_seen_at`` back, as the passing of a day would.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.exceptions import EnqueueError
from jobs.models import Job, RemoteOperation, Worker
from jobs.operations import registry
from jobs.remote_operations import soft_delete_orphan_operations

from .helpers import ECHO, register

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(hours=24)


@pytest.fixture
def operator(server, make_token) -> Iterator[httpx.Client]:
    """A client allowed to enqueue and read (add_job, view_job), not to run remote jobs."""
    key = make_token("operator", remote=False, extra=("add_job", "view_job"))
    with httpx.Client(
        base_url=server.url, trust_env=False, headers={"Authorization": f"Token {key}"}
    ) as client:
        yield client


def post_echo(operator: httpx.Client) -> httpx.Response:
    return operator.post("/jobs", json={"operation": "remote.echo", "payload": {"text": "x"}})


def listed(operator: httpx.Client, name: str) -> dict | None:
    response = operator.get("/operations")
    assert response.status_code == 200, response.text
    return next((op for op in response.json()["results"] if op["name"] == name), None)


def age(name: str, by: timedelta) -> None:
    """What the passing of ``by`` does to an operation nobody serves."""
    RemoteOperation.objects.filter(name=name).update(last_seen_at=timezone.now() - by)


def test_enqueue_works_within_the_grace_after_the_worker_left_and_not_after(api, server, operator):
    worker = register(api)
    assert api.delete(f"/workers/{worker['id']}").status_code == 200
    assert not Worker.objects.exists()
    within = post_echo(operator)
    assert within.status_code == 201, within.text
    assert within.json()["status"] == "queued" and within.json()["queue"] == "remote"
    assert listed(operator, "remote.echo") | {"last_seen_at": None} == {
        "name": "remote.echo",
        "queue": "remote",
        "max_attempts": 3,
        "payload_schema": ECHO["payload_schema"],
        "kind": "remote",
        "description": "",
        "online": False,
        "enqueueable": True,
        "last_seen_at": None,
    }
    age("remote.echo", DAY + timedelta(minutes=1))
    after = post_echo(operator)
    assert after.status_code == 400, after.text
    [message] = after.json()["errors"]["operation"]
    assert message.startswith("Unknown operation 'remote.echo': remote workers declared it")
    assert "24 hours" in message and "REMOTE_OPERATION_GRACE_SECONDS" in message
    assert listed(operator, "remote.echo")["enqueueable"] is False
    # Declared again, it is back at once.
    register(api, ["remote.echo"])
    assert post_echo(operator).status_code == 201
    assert listed(operator, "remote.echo")["online"] is True


def test_an_operation_nobody_declared_says_so(server, operator):
    response = operator.post("/jobs", json={"operation": "never.declared", "payload": {}})
    assert response.status_code == 400
    [message] = response.json()["errors"]["operation"]
    assert message == (
        "Unknown operation 'never.declared': no local operation has this name and no remote "
        "worker has declared it in the last 24 hours. Check the spelling, or start a worker "
        "that declares it."
    )


def test_jobs_enqueued_within_the_grace_wait_for_the_next_worker(api, server):
    first = register(api)
    api.delete(f"/workers/{first['id']}")
    job = enqueue("remote.echo", {"text": "redeploy"})
    # A local worker serving the queue leaves it alone: the declaration is still live.
    local = Worker.objects.create(queues=["remote"])
    skipped = claim_jobs(
        queues=["remote"],
        worker_id=local.pk,
        limit=5,
        lease_seconds=30,
        local_operations=registry.names(),
    )
    assert skipped == []
    second = register(api)
    response = api.post(f"/workers/{second['id']}/claim", json={"limit": 1})
    assert [j["id"] for j in response.json()["jobs"]] == [str(job.pk)]


def test_the_sweep_hides_an_operation_only_after_the_grace(api, server, settings):
    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REMOTE_OPERATION_GRACE_SECONDS": 600}
    worker = register(api)
    api.delete(f"/workers/{worker['id']}")
    assert soft_delete_orphan_operations() == 0  # within the grace
    assert enqueue("remote.echo", {"text": "x"}).status == "queued"
    age("remote.echo", timedelta(minutes=11))
    assert soft_delete_orphan_operations() == 0  # the queued job still needs it
    with pytest.raises(EnqueueError) as refused:
        enqueue("remote.echo", {"text": "y"})
    assert "10 minutes" in refused.value.errors["operation"][0]
    Job.objects.all().delete()
    assert soft_delete_orphan_operations() == 1
    assert RemoteOperation.objects.get(name="remote.echo").deleted is True


def test_a_silent_worker_s_last_heartbeat_starts_the_grace(api, server, settings):
    """A worker that died without a goodbye: its last heartbeat, kept by the sweep while
    its row stays, is when the operation was last served."""
    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REMOTE_OPERATION_GRACE_SECONDS": 600}
    worker = register(api)
    age("remote.echo", DAY)  # as if registered long ago
    silent_since = timezone.now() - timedelta(minutes=5)
    Worker.objects.filter(pk=worker["id"]).update(last_heartbeat=silent_since)
    assert soft_delete_orphan_operations() == 0
    row = RemoteOperation.objects.get(name="remote.echo")
    assert abs(row.last_seen_at - silent_since) < timedelta(seconds=1)
    assert enqueue("remote.echo", {"text": "x"}).queue == "remote"
    Worker.objects.filter(pk=worker["id"]).update(last_heartbeat=silent_since - DAY)
    age("remote.echo", DAY)
    assert soft_delete_orphan_operations() == 0  # a job is queued
    with pytest.raises(EnqueueError):
        enqueue("remote.echo", {"text": "y"})


def test_an_operation_served_by_a_live_worker_never_ages_out(api, server):
    """No reaper has refreshed ``last_seen_at`` for days, but a worker is alive: enqueue
    asks the workers before refusing."""
    register(api)
    age("remote.echo", DAY * 3)
    assert enqueue("remote.echo", {"text": "x"}).status == "queued"
