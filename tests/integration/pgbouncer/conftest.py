"""A PgBouncer of the tests' own (small pool) in front of the test database.

Skipped where there is no PostgreSQL or no ``pgbouncer`` binary; under
``CI=true`` a missing binary fails instead (CI installs it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import database_url_for_subprocess
from tests.integration.pgbouncer.bouncer import PgBouncer, pgbouncer_binary
from tests.integration.remote.helpers import free_port

# Server connections per database: small, so the budget is visible.
POOL_SIZE = 4


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[PgBouncer]:
    """A PgBouncer in transaction mode in front of the server the test database lives on."""
    from django.db import connection

    from jobs.pooling import session_conninfo

    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer pools PostgreSQL connections.")
    if pgbouncer_binary() is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)."
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    direct = session_conninfo()
    if direct is None:
        pytest.skip("The test session is pooled without DATABASE_DIRECT_URL.")
    bouncer = PgBouncer(
        upstream_host=str(direct.get("host") or "127.0.0.1"),
        upstream_port=int(direct.get("port") or 5432),
        user=str(direct.get("user") or "postgres"),
        port=free_port(),
        pool_size=POOL_SIZE,
    )
    with bouncer:
        yield bouncer


def direct_test_url() -> str:
    """The test database on PostgreSQL itself (past the session's own pooler, if any)."""
    from jobs.pooling import direct_url

    return direct_url() or database_url_for_subprocess()


@pytest.fixture
def pooled_env(pgbouncer, transactional_db) -> Callable[..., dict[str, str]]:
    """``pooled_env(direct=True, application_name=None)``: the environment of a process that
    reaches the test database through ``pgbouncer`` (and PostgreSQL itself for LISTEN)."""
    from django.db import connection

    def make(*, direct: bool = True, application_name: str | None = None) -> dict[str, str]:
        url = pgbouncer.url(connection.settings_dict["NAME"])
        if application_name:
            url += f"?application_name={application_name}"
        env = {"DATABASE_URL": url, "CONTROLPLANE_DB_POOLER": "transaction"}
        env["DATABASE_DIRECT_URL"] = direct_test_url() if direct else ""
        return env

    return make
