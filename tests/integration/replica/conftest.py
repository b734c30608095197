"""A real streaming replica of the local PostgreSQL cluster, for the read-replica tests.

Once for this package (``standby``): ``pg_basebackup -R`` of the cluster that holds
the test database, into a temporary directory, started with ``pg_ctl`` on its
own port as the ``postgres`` OS user (PostgreSQL refuses root). The backup is
taken after pytest-django created and migrated the test database, so the
standby starts with it; what the tests write later arrives by streaming
replication like any other change (a database created on the primary after the
backup would appear on the standby too). The copy and the standby read through
a physical replication slot of this session, so the primary keeps the WAL they
still need however busy it is; it is dropped at teardown, and a slot left by a
session that died is dropped by the next one. ``pg_hba.conf`` gets the two
replication lines it needs, if missing, and the primary reloads it (no restart).

Why the ``replica`` alias is set up this way: pytest-django creates, migrates
and (after each transactional test) flushes every database a test names, none
of which a read-only standby allows; ``{"MIRROR": "default"}`` set up by the
test runner points the alias at the primary, so nothing would prove a read came
from the replica. So the alias is not in settings at all when the test
databases are set up; ``standby`` registers it afterwards in
``django.db.connections``, with the test database's name on the standby's port
and ``TEST["MIRROR"]`` naming ``default``. The tests list it in ``databases``
(Django refuses connections to any other alias), and Django's test case leaves
mirrors alone: no flush, no sequence reset on the standby. The mirror setting is
never applied (that happens only while the test databases are set up), so the
alias really connects to the standby. The settings path itself
(``DATABASE_REPLICA_URL``) is exercised by real processes.

PostgreSQL only; on SQLite these tests skip, and on a cluster too big to copy
quickly. A missing tool skips them, except under ``CI=true`` where it fails them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import wait_for

PORT = int(os.environ.get("CONTROLPLANE_TEST_REPLICA_PORT") or 5544)
# A base backup copies the whole cluster; past this it would take too long for a test.
MAX_CLUSTER_MB = int(os.environ.get("CONTROLPLANE_TEST_REPLICA_MAX_CLUSTER_MB") or 4096)
SLOT_PREFIX = "cp_test_replica_"
HBA_LINES = ("host replication all 127.0.0.1/32 trust", "local replication all trust")
# The settings a hot standby needs at least as high as its primary's.
MATCHED_SETTINGS = (
    "max_connections",
    "max_worker_processes",
    "max_wal_senders",
    "max_prepared_transactions",
    "max_locks_per_transaction",
)


def unavailable(reason: str) -> None:
    """Skip, or fail under CI where every tool must be there."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true: {reason}")
    pytest.skip(reason)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _primary_query(sql: str) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


class Standby:
    """The running standby: its control queries, and replay paused or resumed."""

    def __init__(self, bin_dir: Path, data_dir: Path, port: int, dbname: str) -> None:
        self.bin_dir = bin_dir
        self.data_dir = data_dir
        self.port = port
        self.dbname = dbname
        self.slot = f"{SLOT_PREFIX}{os.getpid()}"
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def pg(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.as_postgres, str(self.bin_dir / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        log = str(self.data_dir / "server.log")
        done = self.pg("pg_ctl", "-D", str(self.data_dir), "-l", log, "-w", "-t", "60", "start")
        if done.returncode != 0:
            raise AssertionError(f"The standby did not start: {done.stderr}\n{self.log()}")

    def stop(self, mode: str = "fast") -> None:
        self.pg("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", timeout=60)

    def log(self) -> str:
        try:
            return (self.data_dir / "server.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def query(self, sql: str, params: list[Any] | None = None) -> Any:
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=self.dbname, autocommit=True
        ) as conn:
            return conn.execute(sql, params or []).fetchone()[0]

    def pause_replay(self) -> None:
        self.query("SELECT pg_wal_replay_pause()")
        wait_for(
            lambda: self.query("SELECT pg_get_wal_replay_pause_state()") == "paused",
            message="the standby to pause replay",
        )

    def resume_replay(self) -> None:
        self.query("SELECT pg_wal_replay_resume()")

    def wait_caught_up(self, timeout: float = 60) -> None:
        """Wait until the standby replayed everything the primary has written so far."""
        lsn = _primary_query("SELECT pg_current_wal_lsn()::text")
        wait_for(
            lambda: self.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]),
            timeout=timeout,
            message=f"the standby to replay up to {lsn}",
        )

    def wait_received(self, timeout: float = 60) -> None:
        """Wait until the standby received (not necessarily replayed) the primary's WAL so far."""
        lsn = _primary_query("SELECT pg_current_wal_lsn()::text")
        wait_for(
            lambda: self.query("SELECT pg_last_wal_receive_lsn() >= %s::pg_lsn", [lsn]),
            timeout=timeout,
            message=f"the standby to receive up to {lsn}",
        )


def _ensure_replication_hba() -> None:
    path = Path(_primary_query("SHOW hba_file"))
    try:
        lines = [line.split() for line in path.read_text().splitlines()]
        missing = [want for want in HBA_LINES if want.split() not in lines]
        if missing:
            with path.open("a") as hba:
                hba.write("\n# control plane tests: streaming replica\n")
                hba.writelines(f"{line}\n" for line in missing)
    except OSError as error:
        unavailable(f"Cannot add replication lines to {path}: {error}")
    _primary_query("SELECT pg_reload_conf()")


def _write_standby_config(standby: Standby, settings: dict[str, str]) -> None:
    """Debian keeps postgresql.conf and pg_hba.conf out of the data directory: write our own."""
    lines = [
        f"port = {standby.port}",
        "listen_addresses = '127.0.0.1'",
        f"unix_socket_directories = '{standby.data_dir}'",
        "hot_standby = on",
        "shared_buffers = 32MB",
        "fsync = off",
        # A replayed TRUNCATE (the tests' flush) waits at most this long for a read
        # that holds the table; then the read is cancelled (and retried on the primary).
        "max_standby_streaming_delay = 5s",
        *(f"{name} = {value}" for name, value in settings.items()),
    ]
    (standby.data_dir / "postgresql.conf").write_text("\n".join(lines) + "\n")
    (standby.data_dir / "pg_hba.conf").write_text(
        "local all all trust\nhost all all 127.0.0.1/32 trust\n"
    )
    postgres = pwd.getpwnam("postgres")
    for name in ("postgresql.conf", "pg_hba.conf"):
        os.chown(standby.data_dir / name, postgres.pw_uid, postgres.pw_gid)


def _drop_abandoned_slots() -> None:
    """Drop the slots of earlier test sessions that died before their teardown.

    A slot nobody reads keeps the primary's WAL forever; only inactive slots
    of processes no longer alive are dropped (another session's stays).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE NOT active AND slot_name LIKE %s",
            [f"{SLOT_PREFIX}%"],
        )
        for (name,) in cursor.fetchall():
            pid = int(name.removeprefix(SLOT_PREFIX) or 0)
            if not Path(f"/proc/{pid}").exists():
                cursor.execute("SELECT pg_drop_replication_slot(%s)", [name])


def _drop_slot(name: str) -> None:
    """Drop the slot once the stopped standby's WAL sender let go of it."""
    from django.db import connection

    def released() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [name])
            row = cursor.fetchone()
            return row is None or not row[0]

    wait_for(released, timeout=30, message=f"the slot {name} to be released")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name = %s",
            [name],
        )


def _base_backup(standby: Standby, host: str, port: str) -> None:
    """Copy the cluster through ``standby.slot``, which keeps the WAL the copy and the
    standby need: under other sessions' load a slot-less backup lost its WAL segment."""
    args = ["-h", host, "-p", port, "-U", "postgres", "-D", str(standby.data_dir)]
    args += ["-R", "-X", "stream", "-S", standby.slot, "-c", "fast", "--no-sync"]
    deadline = time.monotonic() + 30
    while True:  # the reloaded pg_hba.conf may take a moment to apply
        done = standby.pg("pg_basebackup", *args, timeout=600)
        if done.returncode == 0:
            return
        if "pg_hba.conf" not in done.stderr or time.monotonic() > deadline:
            raise AssertionError(f"pg_basebackup failed: {done.stderr}")
        for entry in standby.data_dir.iterdir():  # it wants an empty directory
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        time.sleep(0.2)


def _start_standby() -> Standby:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("A streaming replica needs PostgreSQL.")
    major = int(_primary_query("SHOW server_version_num")) // 10000
    bin_dir = Path(f"/usr/lib/postgresql/{major}/bin")
    tools = [bin_dir / "pg_basebackup", bin_dir / "pg_ctl"]
    if not all(tool.exists() for tool in tools) or (
        os.geteuid() == 0 and shutil.which("runuser") is None
    ):
        unavailable(f"pg_basebackup and pg_ctl ({bin_dir}) and runuser are needed.")
    cluster_mb = int(_primary_query("SELECT sum(pg_database_size(oid)) / 1048576 FROM pg_database"))
    if cluster_mb > MAX_CLUSTER_MB:  # benchmark databases, not a missing tool: skip even in CI
        pytest.skip(
            f"The local cluster holds {cluster_mb} MB, more than the {MAX_CLUSTER_MB} MB "
            "a test base backup may copy (CONTROLPLANE_TEST_REPLICA_MAX_CLUSTER_MB)."
        )
    port = PORT
    while not _free(port):
        port += 1
    settings = {name: str(_primary_query(f"SHOW {name}")) for name in MATCHED_SETTINGS}
    _ensure_replication_hba()
    data_dir = Path(tempfile.mkdtemp(prefix="cp-replica-"))
    postgres = pwd.getpwnam("postgres")
    os.chown(data_dir, postgres.pw_uid, postgres.pw_gid)
    data_dir.chmod(0o700)
    standby = Standby(bin_dir, data_dir, port, connection.settings_dict["NAME"])
    _drop_abandoned_slots()
    _primary_query(f"SELECT pg_create_physical_replication_slot('{standby.slot}', true)::text")
    try:
        primary = connection.settings_dict
        host, primary_port = primary.get("HOST") or "127.0.0.1", primary.get("PORT") or 5432
        _base_backup(standby, host, str(primary_port))
        _write_standby_config(standby, settings)
        standby.start()
        standby.wait_caught_up()
    except BaseException:
        standby.stop("immediate")
        _drop_slot(standby.slot)
        shutil.rmtree(data_dir, ignore_errors=True)
        raise
    return standby


@pytest.fixture(scope="package")
def standby(django_db_setup, django_db_blocker) -> Iterator[Standby]:
    """A hot standby of the local cluster, streaming from it, and the ``replica`` alias on it.

    Package-scoped: it stops when these tests are done, so the rest of a
    session does not pay for replaying its writes, and before the test
    database is dropped (it depends on ``django_db_setup``).
    """
    from django.db import connections

    from jobs.replica import REPLICA

    with django_db_blocker.unblock():
        standby = _start_standby()
    primary = connections["default"].settings_dict
    options = {k: v for k, v in primary.get("OPTIONS", {}).items() if k != "pool"}
    before = connections.settings.get(REPLICA)
    _drop_connection(connections, REPLICA)
    connections.settings[REPLICA] = {
        **primary,
        "HOST": "127.0.0.1",
        "PORT": str(standby.port),
        "OPTIONS": {**options, "connect_timeout": 2},
        "TEST": {**primary["TEST"], "MIRROR": "default"},  # see the module docstring
    }
    try:
        yield standby
    finally:
        _drop_connection(connections, REPLICA)
        if before is None:
            del connections.settings[REPLICA]
        else:
            connections.settings[REPLICA] = before
        standby.stop("immediate")
        with django_db_blocker.unblock():
            _drop_slot(standby.slot)
        shutil.rmtree(standby.data_dir, ignore_errors=True)


@pytest.fixture
def replica(standby: Standby, transactional_db, settings) -> Iterator[Standby]:
    """The router and the sticky-primary middleware on, the standby caught up.

    Replay is resumed after the test. The replica's health is measured once
    and kept (``REPLICA_CHECK_SECONDS``): a test calls ``jobs.replica.forget()``
    to measure again.
    """
    from django.db import connections

    from jobs import replica as routing

    settings.DATABASE_ROUTERS = ["jobs.replica.ReplicaRouter"]
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "jobs.replica.StickyPrimaryMiddleware"]
    settings.CONTROLPLANE = {
        **(settings.CONTROLPLANE or {}),
        "REPLICA_MAX_LAG_SECONDS": 3600.0,
        "REPLICA_CHECK_SECONDS": 3600.0,
    }
    standby.resume_replay()
    standby.wait_caught_up()
    routing.forget()
    try:
        yield standby
    finally:
        standby.resume_replay()
        connections[routing.REPLICA].close()  # no session left to hold up the flush's replay
        routing.forget()


def _drop_connection(connections: Any, alias: str) -> None:
    if alias in connections.settings:
        try:
            connections[alias].close()
        except Exception:  # a standby stopped by the test: nothing left to close
            pass
        try:
            del connections[alias]
        except AttributeError:
            pass
