"""A real PgBouncer (Debian ``pgbouncer``) in transaction mode, for tests and the CI pass.

``PgBouncer`` writes an ini and a userlist into a temporary directory, starts
``pgbouncer`` in front of one PostgreSQL server (every database name passes
through: ``* =``), waits until its admin console answers, and stops it.
PgBouncer refuses to run as root, so as root it runs as ``postgres``.

As a script it wraps a command, which then runs with ``DATABASE_URL`` through
the pooler and ``DATABASE_DIRECT_URL`` to PostgreSQL itself::

    python tests/integration/pgbouncer/bouncer.py --port 6433 \\
        --upstream postgres://postgres@127.0.0.1:5432/test -- python -m pytest tests/...

Without the ``pgbouncer`` binary the tests that need one skip, except under
``CI=true``, where they fail: CI installs it (``.ci/run``).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    return found or next((p for p in BINARY_PATHS if os.path.exists(p)), None)


class PgBouncer:
    """One pgbouncer process in transaction mode on ``127.0.0.1:port``.

    ``pool_size`` is ``default_pool_size``: the server connections per
    database and user pair, whatever the number of clients.
    ``server_login_retry`` is how long PgBouncer refuses logins after a failed
    connection to the server (its default is 15 s): short here, so a test that
    restarts PostgreSQL is not refused for 15 s after the server is back.
    """

    def __init__(
        self,
        *,
        upstream_host: str = "127.0.0.1",
        upstream_port: int = 5432,
        user: str = "postgres",
        port: int = 6433,
        pool_size: int = 20,
        max_client_conn: int = 4000,
        server_login_retry: float = 1.0,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.user = user
        self.port = port
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.server_login_retry = server_login_retry
        self.dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    # --- lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 20.0) -> PgBouncer:
        binary = pgbouncer_binary()
        if binary is None:
            raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer).")
        self.dir = Path(tempfile.mkdtemp(prefix="cp-pgbouncer-"))
        ini = self._write_config()
        uid = gid = None
        extra_groups: list[int] | None = None
        if os.geteuid() == 0:  # pgbouncer will not run as root
            account = pwd.getpwnam("postgres")
            uid, gid, extra_groups = account.pw_uid, account.pw_gid, []
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, uid, gid)
        log = open(self.dir / "stdout.log", "wb")
        self.process = subprocess.Popen(
            [binary, str(ini)],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=uid,
            group=gid,
            extra_groups=extra_groups,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.log()}")
            try:
                self.admin("SHOW VERSION")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not answer within {timeout} s.") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # SIGINT: close everything now
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- use ----------------------------------------------------------------------
    def url(self, dbname: str) -> str:
        """A ``DATABASE_URL`` that reaches ``dbname`` through this pooler."""
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, command: str) -> list[dict[str, object]]:
        """Run ``command`` (``SHOW POOLS`` …) on the admin console; rows as dicts."""
        with psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            dbname="pgbouncer",
            autocommit=True,
            connect_timeout=3,
        ) as conn:
            cursor = conn.execute(command)
            if cursor.description is None:
                return []
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def connections(self, dbname: str) -> tuple[int, int]:
        """(client connections, server connections) of ``dbname``'s pools right now."""
        clients = servers = 0
        for pool in self.admin("SHOW POOLS"):
            if pool["database"] == dbname:
                clients += sum(int(pool[k]) for k in ("cl_active", "cl_waiting"))  # type: ignore[call-overload]
                servers += sum(
                    int(pool[k])  # type: ignore[call-overload]
                    for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
                )
        return clients, servers

    def log(self) -> str:
        if self.dir is None:
            return ""
        parts = [p.read_text(errors="replace") for p in sorted(self.dir.glob("*.log"))]
        return "\n".join(parts)[-4000:]

    def _write_config(self) -> Path:
        assert self.dir is not None
        (self.dir / "userlist.txt").write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.upstream_host} port={self.upstream_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    # The local cluster trusts 127.0.0.1; the userlist only names the user.
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'userlist.txt'}",
                    f"admin_users = {self.user}",
                    f"stats_users = {self.user}",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {self.max_client_conn}",
                    f"server_login_retry = {self.server_login_retry:g}",
                    "server_reset_query =",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        return ini


def _with_port(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def main(argv: list[str] | None = None) -> int:
    """Run a command with ``DATABASE_URL`` through a fresh PgBouncer; its exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=6433)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--upstream", default="postgres://postgres@127.0.0.1:5432/test")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    upstream = urlsplit(args.upstream)
    bouncer = PgBouncer(
        upstream_host=upstream.hostname or "127.0.0.1",
        upstream_port=upstream.port or 5432,
        user=upstream.username or "postgres",
        port=args.port,
        pool_size=args.pool_size,
    )
    with bouncer:
        env = {
            **os.environ,
            "DATABASE_URL": _with_port(args.upstream, "127.0.0.1", args.port),
            "DATABASE_DIRECT_URL": args.upstream,
            "CONTROLPLANE_DB_POOLER": "transaction",
        }
        print(
            f"== PgBouncer (transaction mode) on 127.0.0.1:{args.port} in front of {args.upstream}"
        )
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
