"""The worker survives the database going away, and NOTIFY wakes it at once (PostgreSQL).

Also through PgBouncer (the third pass of ``./scripts/dev test``): the sessions
cut are then PgBouncer's server connections and the direct LISTEN ones, and
after a restart the test waits until its own connection answers again, since
PgBouncer refuses logins for ``server_login_retry`` after failing to reach the
server (1 s in the tests' PgBouncer, 15 s by default).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from jobs.pooling import is_transaction_pooled, session_conninfo
from tests.conftest import postgres_server_lock, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def stops_postgres(test):
    """A test that stops the PostgreSQL server: only with CONTROLPLANE_TEST_PG_RESTART=1 (CI).

    Marked ``stops_postgres`` (``./scripts/dev test`` runs the PgBouncer pass's after
    the other passes), and given time to wait for the server (``postgres_server_lock``).
    """
    test = pytest.mark.skipif(
        os.environ.get("CONTROLPLANE_TEST_PG_RESTART") != "1",
        reason="stops the PostgreSQL server: set CONTROLPLANE_TEST_PG_RESTART=1 (CI does)",
    )(test)
    return pytest.mark.timeout(900)(pytest.mark.stops_postgres(test))


def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")


def _answers() -> bool:
    """Whether this process's connection answers (closed for a fresh try when it does not)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - refused (PgBouncer's server_login_retry) or not up yet
        connection.close()
        return False


TERMINATE_OTHER_BACKENDS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def _terminate_other_backends() -> int:
    """Cut every other session of the test database; how many there were.

    Through a transaction pooler, from a direct session: the worker's main loop
    and heartbeat have no sessions of their own there, they borrow PgBouncer's
    server connections, which may be the very one this test's queries run on
    (and would spare). Cutting that one too can fail this process's next query
    through the pooler, so it waits until one answers.
    """
    if not is_transaction_pooled():
        with connection.cursor() as cursor:
            cursor.execute(TERMINATE_OTHER_BACKENDS)
            return cursor.fetchone()[0]
    conninfo = session_conninfo()
    if conninfo is None:
        pytest.skip("Pooled without DATABASE_DIRECT_URL: no session to cut the others from.")
    with psycopg.connect(**conninfo, autocommit=True) as direct:
        (count,) = direct.execute(TERMINATE_OTHER_BACKENDS).fetchone() or (0,)
    wait_for(_answers, timeout=30, message="the test database answering through the pooler")
    return count


def _cluster_of_the_test_database() -> list[str]:
    """``[version, name]`` of the local cluster serving the test database (by its port).

    The port of PostgreSQL itself, past a pooler (``session_conninfo``); the
    first version's ``main`` when no cluster listens there.
    """
    port = str((session_conninfo() or {}).get("port") or 5432)
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True
    ).stdout
    for version, name, cluster_port, *_ in (line.split() for line in listing.splitlines()):
        if cluster_port == port:
            return [version, name]
    return [sorted(os.listdir("/etc/postgresql"))[0], "main"]


@contextmanager
def _postgres_stopped() -> Iterator[None]:
    """The PostgreSQL server down for the block; this process reconnects after it.

    Not while another pass's test holds the server (``postgres_server_lock``).
    """
    cluster = _cluster_of_the_test_database()
    with postgres_server_lock(exclusive=True):
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "stop"], check=True)
        try:
            yield
        finally:
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "start"],
                check=True,
                timeout=60,
            )
    connection.close()
    wait_for(_answers, timeout=30, message="the test database answering after the restart")


def _status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def test_worker_recovers_when_its_connections_are_dropped(worker):
    _postgres_only()
    first = enqueue("ping")
    proc = worker()
    wait_for(lambda: _status(first) == "succeeded", message="first job")
    # Directly: main loop, heartbeat and listener at least. Through a pooler: the
    # listener and the pool's server connection(s) the worker and this test borrow.
    assert _terminate_other_backends() >= 2
    second = enqueue("ping")
    wait_for(lambda: _status(second) == "succeeded", timeout=30, message="job after the drop")
    assert proc.popen.poll() is None, proc.output()


@stops_postgres
def test_worker_recovers_from_a_postgresql_restart(worker):
    _postgres_only()
    proc = worker()
    running = enqueue("sleep", {"seconds": 4})
    wait_for(lambda: _status(running) == "running", message="running")
    with _postgres_stopped():
        # Down for longer than the five attempts of an ordinary retry (about 1.5 s
        # with the test knobs): the job's outcome waits for the database instead
        # of being given up, which would leave the job running until its lease ran out.
        wait_for(
            lambda: "what=outage_requeue attempt=7" in proc.output(),
            timeout=60,
            message="the sleep job's outcome retried past five attempts",
        )
    job = enqueue("ping")
    wait_for(lambda: _status(job) == "succeeded", timeout=60, message="job after restart")
    # The sleep job's run hit the outage: it runs again, its attempt not counted,
    # and its timeline says why (job.outage_requeue, within MAX_OUTAGE_REQUEUES).
    wait_for(lambda: _status(running) == "succeeded", timeout=60, message="the sleep job")
    assert Job.objects.get(pk=running.pk).attempts == 1
    assert "job.outage_requeue" in JobEvent.objects.filter(job_id=running.pk).values_list(
        "event", flat=True
    )
    assert proc.popen.poll() is None, proc.output()


@stops_postgres
def test_a_deferral_reached_during_an_outage_is_stored_when_the_database_returns(worker):
    _postgres_only()
    proc = worker()
    job = enqueue("test.defer_after", {"seconds": 1})
    wait_for(lambda: _status(job) == "running", message="running")
    with _postgres_stopped():
        wait_for(
            lambda: "what=defer attempt=7" in proc.output(),
            timeout=60,
            message="the deferral retried past five attempts",
        )
    wait_for(
        lambda: JobEvent.objects.filter(job_id=job.pk, event="job.deferred").exists(),
        timeout=60,
        message="job.deferred",
    )
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.result, stored.error_code) == ("running", {"deferred": True}, "")
    assert proc.popen.poll() is None, proc.output()


def _listening() -> bool:
    """The worker's listener session is up: it takes its liveness lock (advisory lock class
    0x63706C76, ``workers.liveness``) right after ``LISTEN``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND granted AND pid <> pg_backend_pid() AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            [0x63706C76],
        )
        return cursor.fetchone()[0] > 0


def test_notify_wakes_an_idle_worker_quickly(worker):
    _postgres_only()
    proc = worker(env={"CONTROLPLANE_POLL_SECONDS": "30"})
    warm = enqueue("ping")
    wait_for(lambda: _status(warm) == "succeeded", timeout=40, message="the first claim")
    wait_for(_listening, timeout=10, interval=0.02, message="the worker's listener up")
    job = enqueue("ping")
    wait_for(
        lambda: _status(job) == "succeeded", timeout=5, message="woken by NOTIFY, not the 30 s poll"
    )
    started = JobEvent.objects.get(job_id=job.pk, event="job.started").ts
    assert (started - job.created_at).total_seconds() < 2
    assert proc.popen.poll() is None
