"""Dashboard pages, API lists and /metrics read a real streaming replica; nothing else does.

Each test pauses the standby's replay (``pg_wal_replay_pause()``) and writes on
the primary: what the replica serves then visibly lacks the write, and what
must be fresh visibly has it.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token

from jobs import replica as routing
from jobs.models import Job
from tests.factories import claim, make_user, queued, unique_queue
from tests.integration.api.conftest import ROLE_PERMISSIONS, Api
from tests.integration.api.conftest import make_user as make_api_user
from tests.integration.web.conftest import session_static, start_serve

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "replica"])


def api_client(role: str = "operator") -> Api:
    user = make_api_user(f"{role}-{uuid.uuid4().hex[:6]}", ROLE_PERMISSIONS[role])
    return Api(Token.objects.create(user=user).key)


def dashboard_client(role: str = "operator") -> Client:
    client = Client()
    client.force_login(make_user(role))
    return client


def listed(api: Api, queue: str) -> dict[str, str]:
    """Job id -> status of ``GET /jobs?queue=``."""
    response = api.get("/jobs", queue=queue)
    assert response.status_code == 200, response.content
    return {job["id"]: job["status"] for job in response.json()["results"]}


def queued_gauge(api: Api, queue: str) -> str:
    response = api.get("/metrics")
    assert response.status_code == 200, response.content
    wanted = f'controlplane_jobs{{queue="{queue}",status="queued"}}'
    [line] = [line for line in response.content.decode().splitlines() if line.startswith(wanted)]
    return line.split()[-1]


def replica_queries() -> CaptureQueriesContext:
    return CaptureQueriesContext(connections[routing.REPLICA])


def test_lists_pages_and_metrics_read_the_replica(replica) -> None:
    queue = unique_queue()
    old = queued(queue=queue)
    api, browser = api_client(), dashboard_client()
    replica.wait_caught_up()
    replica.pause_replay()
    new = queued(queue=queue)  # committed on the primary, not replayed on the replica

    with replica_queries() as on_replica:
        assert listed(api, queue) == {str(old.pk): "queued"}
        page = browser.get("/dashboard/jobs/", {"queue": queue}).content.decode()
        assert queued_gauge(api, queue) == "1.0"
    assert on_replica.captured_queries, "nothing was read from the replica"
    assert str(old.pk) in page and str(new.pk) not in page

    # One job, its events, and anything outside a list: the primary.
    with replica_queries() as on_replica:
        assert api.get(f"/jobs/{new.pk}").status_code == 200
        assert api.get(f"/jobs/{new.pk}/events").json()["last_seq"] == 1
    assert not on_replica.captured_queries

    replica.resume_replay()
    replica.wait_caught_up()
    assert set(listed(api, queue)) == {str(old.pk), str(new.pk)}


def test_the_page_after_an_operator_action_reads_the_primary(replica) -> None:
    queue = unique_queue()
    job = queued(queue=queue)
    operator, viewer = dashboard_client("operator"), dashboard_client("viewer")
    api, other_api = api_client(), api_client("viewer")
    replica.wait_caught_up()
    replica.pause_replay()

    # The dashboard: Cancel redirects to the job page, which shows the cancel.
    done = operator.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "test"}, follow=True)
    assert done.redirect_chain and 'class="badge state-cancelled"' in done.content.decode()
    assert routing.STICKY_COOKIE in operator.cookies
    # Another browser, which wrote nothing, still reads the (paused) replica.
    stale = viewer.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    assert 'class="badge state-queued"' in stale

    # The API: the client that cancelled reads its list from the primary for a while.
    assert api.post(f"/jobs/{job.pk}/cancel").status_code == 200
    with replica_queries() as on_replica:
        assert listed(api, queue) == {str(job.pk): "cancelled"}
    assert not on_replica.captured_queries
    assert listed(other_api, queue) == {str(job.pk): "queued"}  # the replica's view


def test_a_lagging_replica_is_not_read(replica, settings) -> None:
    queue = unique_queue()
    api = api_client()
    replica.wait_caught_up()
    replica.pause_replay()
    new = queued(queue=queue)
    replica.wait_received()  # received, not replayed: the replica lags

    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REPLICA_MAX_LAG_SECONDS": 0.0}
    routing.forget()
    lag = routing.health().lag
    assert lag is not None and lag > 0
    with replica_queries() as on_replica:
        assert listed(api, queue) == {str(new.pk): "queued"}
        assert routing.choose_alias() == "default"
    assert not on_replica.captured_queries  # the lag was measured before: nothing else

    # The same lag under a looser bound: the replica is read, and lacks the job.
    settings.CONTROLPLANE = {**settings.CONTROLPLANE, "REPLICA_MAX_LAG_SECONDS": 3600.0}
    assert listed(api, queue) == {}


def test_claims_transitions_and_enqueue_never_touch_the_replica(replica) -> None:
    queue = unique_queue()
    api, browser = api_client(), dashboard_client()
    replica.pause_replay()
    with replica_queries() as on_replica:
        created = api.post("/jobs", {"operation": "ping", "queue": queue})
        assert created.status_code == 201, created.content
        job = Job.objects.get(pk=created.json()["id"])
        held = claim(job)  # the job exists only on the primary
        assert api.post(f"/jobs/{job.pk}/cancel").json()["status"] == "cancelled"
        assert api.post(f"/jobs/{job.pk}/retry").json()["status"] == "queued"
        other = queued(queue=queue)
        browser.post(f"/dashboard/jobs/{other.pk}/cancel/", {"reason": "test"})
    assert not on_replica.captured_queries, on_replica.captured_queries
    assert held.id == job.pk
    assert Job.objects.get(pk=other.pk).status == "cancelled"


def test_a_write_inside_a_replica_read_sends_the_rest_to_the_primary(replica) -> None:
    replica.pause_replay()
    job = queued()
    with routing.reading(routing.REPLICA):
        assert not Job.objects.filter(pk=job.pk).exists()  # the paused replica
        Job.objects.filter(pk=job.pk).update(priority=7)  # a write: the primary
        assert Job.objects.get(pk=job.pk).priority == 7  # read after write: the primary
    assert routing.read_alias() == "default"


def test_a_replica_that_goes_down_leaves_pages_on_the_primary(replica) -> None:
    queue = unique_queue()
    job = queued(queue=queue)
    api, browser = api_client(), dashboard_client()
    replica.wait_caught_up()
    with replica_queries() as on_replica:
        assert listed(api, queue) == {str(job.pk): "queued"}
    assert on_replica.captured_queries
    replica.stop("fast")
    try:
        # Known healthy a moment ago: the read fails there and runs again on the primary.
        assert listed(api, queue) == {str(job.pk): "queued"}
        assert routing.health().lag is None  # marked down
        assert str(job.pk) in browser.get("/dashboard/jobs/", {"queue": queue}).content.decode()
        assert queued_gauge(api, queue) == "1.0"
        routing.forget()  # measured again: it cannot be reached, so it is not read
        assert routing.choose_alias() == "default"
        assert listed(api, queue) == {str(job.pk): "queued"}
    finally:
        replica.start()
    replica.wait_caught_up()
    routing.forget()
    assert routing.choose_alias() == routing.REPLICA


def test_database_replica_url_configures_real_processes(replica, start_process) -> None:
    """A worker and a shell started with DATABASE_REPLICA_URL: claims on the primary,
    opted-in reads on the replica."""
    queue = unique_queue()
    replica.pause_replay()
    job = queued(queue=queue, operation="ping")
    url = f"postgres://postgres@127.0.0.1:{replica.port}/{replica.dbname}"
    env = {"DATABASE_REPLICA_URL": url, "CONTROLPLANE_REPLICA_MAX_LAG_SECONDS": "3600"}

    worker = start_process("runworker", "--queue", queue, "--burst", env=env)
    assert worker.wait(timeout=60) == 0, worker.output()
    assert Job.objects.get(pk=job.pk).status == "succeeded"

    script = (
        "from django.conf import settings; from django.db import router; "
        "from jobs import replica; from jobs.models import Job; "
        f"seen = lambda: Job.objects.filter(pk='{job.pk}').exists(); "
        "print(sorted(settings.DATABASES), settings.DATABASE_ROUTERS, "
        "replica.on_replica(seen), seen())"
    )
    shell = start_process("shell", "-c", script, env=env)
    assert shell.wait(timeout=60) == 0, shell.output()
    assert "['default', 'replica'] ['jobs.replica.ReplicaRouter'] False True" in shell.output()


def test_serve_reads_lists_from_the_replica_through_a_pool_of_its_own(
    replica, tmp_path, tmp_path_factory
) -> None:
    """The production web setup (``manage.py serve``, pooled connections) with the setting."""
    queue = unique_queue()
    replica.pause_replay()
    job = queued(queue=queue)
    headers = api_client().headers  # made after the pause: authentication reads the primary
    url = f"postgres://postgres@127.0.0.1:{replica.port}/{replica.dbname}"
    env = {"DATABASE_REPLICA_URL": url, "CONTROLPLANE_REPLICA_MAX_LAG_SECONDS": "3600"}
    static = session_static(tmp_path_factory)
    served = start_serve(tmp_path, processes=1, threads=2, env=env, collected=static)

    def get(path: str, **params: str) -> httpx.Response:
        return httpx.get(
            served.url + path, params=params, headers=headers, trust_env=False, timeout=30
        )

    try:
        listed = get("/jobs", queue=queue)
        assert listed.status_code == 200, listed.text
        assert listed.json()["results"] == []  # the paused replica
        assert get(f"/jobs/{job.pk}").json()["status"] == "queued"  # the primary
        pooled = replica.query(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)",
            [sorted(served.process_names())],
        )
        assert pooled >= 1, "no pooled web connection on the replica"
    finally:
        served.stop()
