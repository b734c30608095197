"""Fixtures of the packaging tests: one wheel and one virtualenv per run, a project per database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
import pytest

from tests.conftest import postgres_server_lock
from tests.integration.installed.host_project import (
    HostProject,
    Venv,
    build_wheel,
    make_venv,
    start_project,
)

# The server ./scripts/dev tests against (the same variable and default).
POSTGRES_URL = os.environ.get(
    "CONTROLPLANE_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("venv") / "venv", wheel)


@pytest.fixture
def postgres_database() -> Iterator[dict[str, str]]:
    """A fresh, uniquely named database on the test server, dropped afterwards.

    An unreachable server skips the PostgreSQL variant on a workstation; under
    CI (``CI=true``) it fails, so the variant cannot silently vanish there.
    """
    url = urlsplit(POSTGRES_URL)
    server = {
        "HOST": url.hostname or "127.0.0.1",
        "PORT": str(url.port or 5432),
        "USER": unquote(url.username or "postgres"),
        "PASSWORD": unquote(url.password or ""),
    }
    conninfo = {k.lower(): v for k, v in server.items() if v}
    try:
        admin = psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=3, **conninfo)
    except psycopg.OperationalError as error:
        message = f"PostgreSQL is not reachable at {POSTGRES_URL}: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    name = f"cp_host_{uuid.uuid4().hex[:12]}"
    admin.close()
    # The PostgreSQL pass may run beside this one: its restart test waits for this test.
    with postgres_server_lock(exclusive=False):
        with psycopg.connect(dbname="postgres", autocommit=True, **conninfo) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield {"ENGINE": "django.db.backends.postgresql", "NAME": name, **server}
        finally:
            with psycopg.connect(dbname="postgres", autocommit=True, **conninfo) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def host_project(request: pytest.FixtureRequest, tmp_path: Path) -> HostProject:
    """``mysite`` + ``billing`` on startproject's SQLite file or on a fresh PostgreSQL database.

    The database comes first, so an unreachable server skips before the wheel is built.
    """
    database = None
    if request.param == "postgresql":
        database = request.getfixturevalue("postgres_database")
    venv: Venv = request.getfixturevalue("venv")
    return start_project(tmp_path / "host", venv, database)
