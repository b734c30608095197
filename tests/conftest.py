"""Fixtures shared by every tier: the database URL for subprocesses, waiting, workers."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Small timing knobs for every process a test starts (CONTRACT.md names).
FAST_KNOBS = {
    "CONTROLPLANE_LEASE_SECONDS": "3",
    "CONTROLPLANE_HEARTBEAT_SECONDS": "0.3",
    "CONTROLPLANE_POLL_SECONDS": "0.2",
    "CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "2",
    "CONTROLPLANE_RETRY_BACKOFF_SECONDS": "0.1",
    "CONTROLPLANE_REAPER_INTERVAL_SECONDS": "0.3",
    "CONTROLPLANE_WORKER_TIMEOUT_SECONDS": "3",
    "CONTROLPLANE_BATCH_VISIBILITY_SECONDS": "3",
    "CONTROLPLANE_DB_RETRY_INITIAL_SECONDS": "0.1",
    "CONTROLPLANE_DB_RETRY_MAX_SECONDS": "1",
    # Each test starts from a flushed database, which a server's cached queue settings miss.
    "CONTROLPLANE_QUEUE_SETTINGS_CACHE_SECONDS": "0",
}


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str = "condition",
) -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout} s waiting for {message}.")
        time.sleep(interval)


@contextmanager
def postgres_server_lock(*, exclusive: bool) -> Iterator[None]:
    """Hold the PostgreSQL server: shared while a test uses it beside its own pass's
    database, exclusive while a test stops it.

    ``./scripts/dev test`` runs its three passes side by side. The SQLite pass's
    installed-wheel test makes a database of its own on the same server, and the
    PgBouncer pass uses the server all along (``scripts/dev`` holds this lock shared
    around it): the PostgreSQL pass's restart tests must not stop it under them.
    A file lock (``flock``), so it holds across processes.
    """
    path = Path(tempfile.gettempdir()) / "controlplane-tests-postgres-server.lock"
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def database_url_for_subprocess() -> str:
    """The URL of the database this test session uses (the test database, not the dev one)."""
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(settings['NAME']).resolve()}"
    user = settings.get("USER") or ""
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings['NAME']}"


@pytest.fixture
def subprocess_env(transactional_db) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FAST_KNOBS)
    env["DATABASE_URL"] = database_url_for_subprocess()
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("CONTROLPLANE_TEST_DB_NAME", None)
    return env


class Process:
    """A management command running as a real process, with its output kept for failures."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.popen.wait(timeout=timeout)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)
        self._log.close()


@pytest.fixture
def start_process(subprocess_env, tmp_path) -> Iterator[Callable[..., Process]]:
    """Start ``manage.py <args>`` as a real process; it is killed at teardown."""
    started: list[Process] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Process:
        merged = {**subprocess_env, **(env or {})}
        proc = Process(list(args), merged, tmp_path / f"proc-{len(started)}.log")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
    if started:
        wait_for_other_sessions_to_finish()  # a killed client's backend ends its statement first


def wait_for_other_sessions_to_finish(timeout: float = 5.0) -> None:
    """Wait (bounded) until no other session of the test database is inside a transaction.

    The teardown's flush (``TRUNCATE``) locks table after table; a
    transaction of another process that holds one of them and then wants
    another deadlocks it. Run before the flush.
    """
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2 and time.monotonic() < deadline:
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND state IN ('active', 'idle in transaction')"
                )
                busy = cursor.fetchone()[0]
        except DatabaseError:  # a test that restarted PostgreSQL: nothing to wait for here
            return
        quiet = 0 if busy else quiet + 1
        if quiet < 2:
            time.sleep(0.02)


@pytest.fixture(autouse=True)
def _forget_cached_queue_settings() -> Iterator[None]:
    """The flush between tests deletes queue and key limit rows without signals: start from
    cold caches (queue settings, key limits, the queues marked keyed)."""
    from django_controlplane.remote.runs import queue_settings
    from jobs import key_limits
    from jobs.fair_turns import forget_keyed_queues

    queue_settings.forget()
    key_limits.forget()
    forget_keyed_queues()
    yield


@pytest.fixture
def lagging_clock_reading(monkeypatch) -> None:
    """This process's reading of the database's clock, 5 s behind it: a reading lags by up
    to its round trip (a slow one under load). PostgreSQL only: SQLite's clock is ours."""
    from datetime import timedelta

    from jobs import clock

    behind = clock.db_now() - timedelta(seconds=5)
    lagging = clock.Reading(db=behind, monotonic=time.monotonic(), skew=5.0, round_trip=5.0)
    monkeypatch.setitem(clock._readings, "default", lagging)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Behind a transaction pooler (``jobs.pooling``; the CI pass through PgBouncer).

    Child processes get the test database's direct URL (the environment's
    names the configured database), and the pooler's server sessions on the
    test database end before it is dropped: PostgreSQL refuses to drop a
    database anyone is connected to, and a pooler keeps idle sessions open.
    """
    from jobs.pooling import direct_url, is_transaction_pooled

    if not is_transaction_pooled():
        yield
        return
    previous = os.environ.get("DATABASE_DIRECT_URL")
    url = direct_url()
    if url:
        os.environ["DATABASE_DIRECT_URL"] = url
    yield
    if previous is not None:
        os.environ["DATABASE_DIRECT_URL"] = previous
    with django_db_blocker.unblock():
        from django.db import connection

        name = connection.settings_dict["NAME"]
        connection.close()
        # From the maintenance database: a server session of its own, apart from the test one's.
        with connection._nodb_cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                [name],
            )
