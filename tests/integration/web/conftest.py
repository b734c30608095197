"""Fixtures for the web tier: `manage.py serve` (several processes, one port), test database."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_for
from tests.integration.remote.helpers import Proc, free_port, server_env


class Served:
    def __init__(self, url: str, proc: Proc, processes: int) -> None:
        self.url = url
        self.proc = proc
        self.processes = processes

    def process_names(self) -> set[str]:
        """The ``application_name`` of each serving process's pool connections (other tests'
        servers, such as the remote tests' session daphne, share the test database)."""
        pid = self.proc.popen.pid
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:
            children = []
        return {f"controlplane-web-{child}" for child in [str(pid), *children]}

    def stop(self) -> None:
        """SIGTERM (the supervisor stops its server processes), SIGKILL after 15 s."""
        if self.proc.popen.poll() is None:
            self.proc.signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self.proc.stop()


def collect_static(static_root: Path) -> Path:
    """Static files collected into ``static_root`` the way ``manage.py serve`` collects them
    (hashed, compressed names), for servers started with ``collected=static_root``."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "collectstatic", "--noinput", "-v0"],
        env=server_env(
            {"CONTROLPLANE_STATIC_ROOT": str(static_root), "CONTROLPLANE_STATIC_MANIFEST": "1"}
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return static_root


def start_serve(
    log_dir: Path,
    *,
    processes: int = 2,
    threads: int = 4,
    env: dict[str, str] | None = None,
    collected: Path | None = None,
) -> Served:
    """``manage.py serve``; it collects the static files itself, unless ``collected`` names
    a folder ``collect_static`` filled (collecting takes seconds, and is the same every time).
    """
    port = free_port()
    static: dict[str, str] = {"CONTROLPLANE_STATIC_ROOT": str(log_dir / "static")}
    skip: list[str] = []
    if collected is not None:
        static = {"CONTROLPLANE_STATIC_ROOT": str(collected), "CONTROLPLANE_STATIC_MANIFEST": "1"}
        skip = ["--no-collectstatic"]
    proc = Proc(
        [
            sys.executable,
            "manage.py",
            "serve",
            "--port",
            str(port),
            "--processes",
            str(processes),
            "--threads",
            str(threads),
            *skip,
        ],
        server_env({**static, **(env or {})}),
        log_dir / f"serve-{port}.log",
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.popen.poll() is None, f"serve exited:\n{proc.output()}"
        try:
            return httpx.get(url + "/workers", timeout=1, trust_env=False).status_code == 401
        except httpx.TransportError:
            return False

    wait_for(answers, timeout=60, interval=0.2, message="manage.py serve to answer")
    return Served(url, proc, processes)


def session_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The static files collected once per test session, for every ``start_serve`` of it
    (read-only to the servers), whichever test asks first."""
    return _collected_once(tmp_path_factory.getbasetemp())


@functools.cache
def _collected_once(session_temp: Path) -> Path:
    return collect_static(session_temp / "collected-static")


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory) -> Path:
    return session_static(tmp_path_factory)


@pytest.fixture
def serve(transactional_db, tmp_path, collected_static) -> Iterator[Callable[..., Served]]:
    """``serve(processes=2, threads=4, env={...})``: a running ``manage.py serve`` on the
    session's collected static files; ``serve(..., collectstatic=True)`` collects its own."""
    started: list[Served] = []

    def start(*, collectstatic: bool = False, **kwargs) -> Served:
        collected = None if collectstatic else collected_static
        served = start_serve(tmp_path, collected=collected, **kwargs)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture
def make_token(transactional_db) -> Callable[..., str]:
    """A token of a new user holding ``codenames`` (default: every jobs permission)."""
    from django.contrib.auth.models import Permission, User
    from rest_framework.authtoken.models import Token

    def make(username: str, *codenames: str) -> str:
        user = User.objects.create_user(username)
        wanted = codenames or ("view_job", "add_job", "change_job", "run_remote_jobs")
        user.user_permissions.add(*Permission.objects.filter(codename__in=wanted))
        return Token.objects.create(user=user).key

    return make
