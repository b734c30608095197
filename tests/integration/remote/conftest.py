"""Fixtures for the remote-worker tests: a real daphne server, real client processes, tokens.

The server (``daphne controlplane.asgi:application`` on a free port) is
started once for the session against the test database; every test still gets a
clean database (``transactional_db``), so the server only ever sees
committed rows, as in production.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest

from .helpers import CLIENT_APP, ROOT, Proc, Server, start_server


@pytest.fixture(scope="session")
def server(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Server]:
    """One daphne for these tests, against the test database (each test still starts clean)."""
    with django_db_blocker.unblock():
        running = start_server(tmp_path_factory.mktemp("server"))
    yield running
    running.proc.stop()


@pytest.fixture
def make_token(transactional_db) -> Callable[..., str]:
    """Create a user (with ``controlplane.run_remote_jobs`` unless ``remote=False``, plus the
    ``extra`` codenames) and return its token."""
    from django.contrib.auth.models import Permission, User
    from rest_framework.authtoken.models import Token

    def make(username: str = "remote", *, remote: bool = True, extra: tuple[str, ...] = ()) -> str:
        user = User.objects.create_user(username)  # no password: no slow hashing
        codenames = [*(["run_remote_jobs"] if remote else []), *extra]
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        return Token.objects.create(user=user).key

    return make


@pytest.fixture
def token(make_token) -> str:
    return make_token()


@pytest.fixture
def api(server: Server, token: str) -> Iterator[httpx.Client]:
    """An HTTP client of the server, authenticated as a remote-worker user."""
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Token {token}"},
        timeout=40,
        trust_env=False,
    ) as client:
        yield client


@pytest.fixture
def start_client(server: Server, token: str, tmp_path) -> Iterator[Callable[..., Proc]]:
    """Run ``client_app.py`` (the real client, no Django) in its own process."""
    started: list[Proc] = []

    def start(*args: str, url: str | None = None, auth: str | None = None) -> Proc:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO", "DATABASE", "CONTROLPLANE"))
        }
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(ROOT)
        proc = Proc(
            [
                sys.executable,
                str(CLIENT_APP),
                "--url",
                url or server.url,
                "--token",
                auth or token,
                *args,
            ],
            env,
            tmp_path / f"client-{len(started)}.log",
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session", autouse=True)
def _close_the_listen_connection(django_db_setup, django_db_blocker) -> Iterator[None]:
    """The relays' shared LISTEN connection (PostgreSQL) must close before the test
    database is dropped; it is torn down before ``django_db_setup``, which it depends on."""
    yield
    from django_controlplane.web.listener import listener

    listener.stop()
