"""Fixtures for the web tier: `manage.py serve` (several processes, one port), test database."""

from __future__ import annotations

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


def start_serve(
    log_dir: Path, *, processes: int = 2, threads: int = 4, env: dict[str, str] | None = None
) -> Served:
    port = free_port()
    static_root = log_dir / "static"
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
        ],
        server_env({"CONTROLPLANE_STATIC_ROOT": str(static_root), **(env or {})}),
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


@pytest.fixture
def serve(transactional_db, tmp_path) -> Iterator[Callable[..., Served]]:
    """``serve(processes=2, threads=4, env={...})``: a running ``manage.py serve``."""
    started: list[Served] = []

    def start(**kwargs) -> Served:
        served = start_serve(tmp_path, **kwargs)
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
