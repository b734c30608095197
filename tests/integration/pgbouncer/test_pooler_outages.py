"""A server session lost behind a real PgBouncer is an outage, not the operation's failure.

Through PgBouncer a session cut while its client is idle in a transaction
reaches psycopg at ``COMMIT`` as ``InternalError("received 2 results from
command 'COMMIT'")`` (the server's FATAL error, then PgBouncer's "server conn
crashed?"), with no SQLSTATE; a session cut just before PgBouncer hands it to
the next transaction, as the same error for its ``BEGIN``. ``test_chaos`` met
both, rarely, when ``pg_terminate_backend`` landed there. Here the first
happens every time, through Django's own ``atomic``, and the second is raced for.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import DatabaseError, connection, connections, transaction

from tests.integration.pgbouncer.bouncer import PgBouncer
from tests.integration.remote.helpers import free_port
from workers.pooler_outages import session_lost_behind_pooler
from workers.resilience import is_outage, is_transient

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "through-test-pgbouncer"
RACED = "cp-pooler-outage-race"  # the application_name of the raced server connections
BEGIN_RACES = 60


def answers() -> bool:
    """Through a pooler the health check answers (the pooler does): the error must decide."""
    return True


@contextmanager
def pooled_alias(bouncer: PgBouncer, *, application_name: str = "") -> Iterator[str]:
    """A Django connection to the test database through ``bouncer``, as ``connections[ALIAS]``."""
    settings = copy.deepcopy(connection.settings_dict)
    settings.update(HOST="127.0.0.1", PORT=bouncer.port, USER=bouncer.user, PASSWORD="")
    options = dict(settings.get("OPTIONS") or {})
    options.pop("pool", None)
    options["prepare_threshold"] = None
    if application_name:
        options["application_name"] = application_name
    settings["OPTIONS"] = options
    connections[ALIAS] = type(connections["default"])(settings, alias=ALIAS)
    try:
        yield ALIAS
    finally:
        connections[ALIAS].close()
        del connections[ALIAS]


def terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def backend_pid(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_session_cut_before_commit_is_an_outage(pgbouncer):
    with pooled_alias(pgbouncer) as alias:
        with pytest.raises(DatabaseError) as caught, transaction.atomic(using=alias):
            terminate(backend_pid(alias))  # idle in transaction now, then COMMIT
    error = caught.value
    assert "received 2 results from command 'COMMIT'" in str(error)
    assert any(session_lost_behind_pooler(link) for link in (error, error.__cause__))
    assert is_outage(error, health_check=answers)
    assert is_transient(error)  # a worker's own COMMIT is retried, not raised


def test_a_session_cut_before_begin_is_an_outage(pgbouncer):
    # PgBouncer drops a dead idle server connection as soon as it reads the
    # server's goodbye; a transaction that starts before it did gets that
    # connection, and psycopg two results for its BEGIN (half the time here).
    mismatches = []
    with pooled_alias(pgbouncer, application_name=RACED) as alias:
        for _ in range(BEGIN_RACES):
            backend_pid(alias)  # the pool holds a server connection of RACED's now
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s AND datname = current_database()",
                    [RACED],
                )
            try:
                with transaction.atomic(using=alias):
                    backend_pid(alias)
            except DatabaseError as error:
                if "from command 'BEGIN'" in str(error):
                    mismatches.append(error)
                connections[alias].close()
    if not mismatches:
        pytest.skip(f"PgBouncer noticed every cut in time ({BEGIN_RACES} tries).")
    assert all(is_outage(error, health_check=answers) for error in mismatches)
    assert all(is_transient(error) for error in mismatches)


def test_a_statement_on_a_cut_session_is_an_outage(pgbouncer):
    with pooled_alias(pgbouncer) as alias:
        with pytest.raises(DatabaseError) as caught, transaction.atomic(using=alias):
            terminate(backend_pid(alias))
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1")
    assert is_outage(caught.value, health_check=answers)
    assert is_transient(caught.value)


def test_a_connection_pgbouncer_refuses_is_an_outage(pgbouncer):
    with PgBouncer(
        upstream_host=pgbouncer.upstream_host,
        upstream_port=pgbouncer.upstream_port,
        user=pgbouncer.user,
        port=free_port(),
        max_client_conn=1,
    ) as full:
        with pooled_alias(full) as alias:
            connections[alias].ensure_connection()  # the one client it allows
            second = type(connections[alias])(connections[alias].settings_dict, alias=f"{alias}-2")
            with pytest.raises(DatabaseError) as caught:
                second.ensure_connection()
    assert "max_client_conn" in str(caught.value)
    assert is_outage(caught.value, health_check=answers)
    assert is_transient(caught.value)
