"""Workers, the reaper and the web processes through a real PgBouncer in transaction mode.

The pool has ``POOL_SIZE`` server connections; everything that needs a
session (LISTEN, the liveness lock) goes to PostgreSQL directly. The budget
test counts the server sessions PostgreSQL itself sees (``pg_stat_activity``).
"""

from __future__ import annotations

import signal
import threading

import httpx
import psycopg
import pytest

from jobs.enqueue import enqueue
from jobs.models import Job, Worker
from jobs.states import SUCCEEDED
from tests.conftest import wait_for
from tests.integration.pgbouncer.conftest import POOL_SIZE, direct_test_url

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_PROCESSES = 4  # two `runworker --processes 2`
CONCURRENCY = 8
JOBS = 240


def succeeded(jobs: list[Job]) -> int:
    return Job.objects.filter(pk__in=[j.pk for j in jobs], status=SUCCEEDED).count()


class Sampler(threading.Thread):
    """Samples, every few milliseconds, the server sessions named ``application_name``
    (pg_stat_activity, on a connection of its own) and the pooler's client and server counts."""

    def __init__(self, bouncer, dbname: str, application_name: str) -> None:
        super().__init__(daemon=True)
        self.bouncer = bouncer
        self.dbname = dbname
        self.application_name = application_name
        self.stop = threading.Event()
        self.max_backends = self.max_clients = self.max_servers = 0
        self.samples = 0

    def run(self) -> None:
        url = direct_test_url().replace("postgres://", "postgresql://", 1)
        with psycopg.connect(url, autocommit=True, application_name="cp-budget-sampler") as conn:
            while not self.stop.is_set():
                (backends,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND application_name = %s",
                    [self.dbname, self.application_name],
                ).fetchone()
                clients, servers = self.bouncer.connections(self.dbname)
                self.max_backends = max(self.max_backends, backends)
                self.max_clients = max(self.max_clients, clients)
                self.max_servers = max(self.max_servers, servers)
                self.samples += 1
                self.stop.wait(0.02)


@pytest.mark.parametrize("listen", [True, False], ids=["listen-directly", "poll-only"])
def test_a_fleet_of_workers_shares_a_small_pool(pgbouncer, pooled_env, start_process, listen):
    """4 worker processes of concurrency 8 (``concurrency + 3`` = 44 sessions without a
    pooler) and a reaper run 240 jobs on at most POOL_SIZE pooled server sessions, plus
    one direct session per worker process (its LISTEN and liveness lock) unless the
    workers only poll (``POLL_ONLY``): then the pool is all there is."""
    from django.db import connection

    dbname = connection.settings_dict["NAME"]
    env = pooled_env(application_name="cp-budget")
    if not listen:
        env["CONTROLPLANE_POLL_ONLY"] = "1"
    supervisors = [
        start_process(
            "runworker",
            "--queue",
            "default",
            "--processes",
            "2",
            "--concurrency",
            str(CONCURRENCY),
            env=env,
        )
        for _ in range(WORKER_PROCESSES // 2)
    ]
    start_process("reaper", env=env)
    ready = Worker.objects.filter(liveness_lock=True) if listen else Worker.objects.all()
    wait_for(
        lambda: ready.count() == WORKER_PROCESSES,
        timeout=60,
        message="every worker process to register (and hold its lock on its direct session)",
    )
    sampler = Sampler(pgbouncer, dbname, "cp-budget")
    sampler.start()
    try:
        jobs = [enqueue("sleep", {"seconds": 0.05}) for _ in range(JOBS)]
        wait_for(lambda: succeeded(jobs) == JOBS, timeout=120, message="every job to succeed")
    finally:
        sampler.stop.set()
        sampler.join(10)
        for supervisor in supervisors:  # SIGTERM: the supervisor stops its children
            supervisor.signal(signal.SIGTERM)
        for supervisor in supervisors:
            supervisor.wait(30)
    direct = WORKER_PROCESSES if listen else 0
    print(
        f"\nbudget ({'listen' if listen else 'poll-only'}): {WORKER_PROCESSES} worker processes"
        f" x concurrency {CONCURRENCY} + reaper:"
        f" max pooler clients {sampler.max_clients}, max pooler server connections"
        f" {sampler.max_servers} (pool {POOL_SIZE}), max PostgreSQL sessions"
        f" {sampler.max_backends} ({sampler.samples} samples)"
    )
    assert sampler.samples > 0
    assert sampler.max_servers <= POOL_SIZE
    # Pooled sessions, plus each listening worker process's direct one; none of the rest.
    assert sampler.max_backends <= POOL_SIZE + direct
    # Every job thread had a client connection of its own: the pool multiplexed them.
    assert sampler.max_clients >= WORKER_PROCESSES * CONCURRENCY


def test_notify_through_the_pooler_wakes_a_worker_listening_directly(pooled_env, start_process):
    """The worker polls once a minute: only the NOTIFY (sent through PgBouncer at the
    enqueue's commit, heard on the worker's direct LISTEN session) makes it claim in time."""
    start_process(
        "runworker",
        "--queue",
        "default",
        env={**pooled_env(), "CONTROLPLANE_POLL_SECONDS": "60"},
    )
    wait_for(
        lambda: Worker.objects.filter(liveness_lock=True).exists(),
        timeout=60,
        message="the worker to LISTEN and hold its liveness lock",
    )
    job = enqueue("ping", {})
    wait_for(
        lambda: Job.objects.filter(pk=job.pk, status=SUCCEEDED).exists(),
        timeout=30,
        message="the job to run before the next poll (a minute away)",
    )


def test_without_a_direct_url_workers_only_poll(pooled_env, start_process):
    """Pooled with no DATABASE_DIRECT_URL: no LISTEN and no liveness lock through the pooler
    (a session lock there would stay on whichever server session ran it); jobs still run."""
    start_process("runworker", "--queue", "default", env=pooled_env(direct=False))
    wait_for(lambda: Worker.objects.exists(), timeout=60, message="the worker to register")
    jobs = [enqueue("ping", {}) for _ in range(20)]
    wait_for(lambda: succeeded(jobs) == len(jobs), timeout=60, message="the jobs to succeed")
    assert not Worker.objects.filter(liveness_lock=True).exists()


def test_web_processes_through_the_pooler(pooled_env, tmp_path, tmp_path_factory):
    """``manage.py serve`` with its connection pool behind PgBouncer answers the API, the
    same statements many times over (no prepared statement to lose between transactions)."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    from tests.integration.web.conftest import session_static, start_serve

    token = Token.objects.create(user=User.objects.create_superuser("pooled-web")).key
    static = session_static(tmp_path_factory)
    served = start_serve(tmp_path, processes=1, threads=2, env=pooled_env(), collected=static)
    try:
        headers = {"Authorization": f"Token {token}"}
        created = httpx.post(
            served.url + "/jobs",
            json={"operation": "ping", "payload": {}},
            headers=headers,
            timeout=10,
            trust_env=False,
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        for _ in range(12):  # psycopg would prepare from the 5th execution on
            for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", "/jobs", "/queues"):
                response = httpx.get(
                    served.url + path, headers=headers, timeout=10, trust_env=False
                )
                assert response.status_code == 200, (path, response.text)
    finally:
        served.stop()
