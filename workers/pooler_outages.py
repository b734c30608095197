"""A server session lost behind a transaction pooler (PgBouncer), as psycopg reports it.

Connected directly, a session cut by ``pg_terminate_backend`` or a restart
reaches psycopg as the server's own error (57P01 admin_shutdown, class 08)
or as an ``OperationalError`` without SQLSTATE, and ``is_outage`` counts it.
Behind PgBouncer most of that still holds, since PgBouncer reports its own
failures with a SQLSTATE of class 08 (08P01 in 1.18: "server conn crashed?",
"query_wait_timeout", "server login has been failing, try again later
(server_login_retry)", "pgbouncer cannot connect to server") or, in later
versions, with PostgreSQL's own code (53300 for "no more connections allowed
(max_client_conn)", the server's 57P03 while it starts), and a refused
connection arrives as an ``OperationalError`` without SQLSTATE.

One case does not: the server session dies while its client waits on a
one-statement command that psycopg sends itself (``BEGIN``, ``COMMIT``,
``ROLLBACK``). PgBouncer forwards the server's FATAL error, then adds its own
"server conn crashed?" and closes the client, so psycopg receives two results
for one command and raises ``InternalError("received 2 results from command
'COMMIT'")``: no SQLSTATE, and an ``InternalError`` besides, which otherwise
means a fault inside the server. A server that answers one statement with two
results is not something SQL can cause, but an ``InternalError`` is not
called an outage on its message alone: the connection that raised it must be
closed afterwards (psycopg marks it so when the pooler hung up). That
connection is found in the error's traceback (``self`` of psycopg's
``commit``, or of the cursor whose ``execute`` sent the ``BEGIN``: psycopg cuts
its tracebacks short at the cursor), since Django replaces the thread's
connection right after such an error (its rollback fails, it drops the
connection and opens a new one to restore autocommit).
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

# psycopg's message when an internal command got more (or fewer) results than one.
RESULTS_MISMATCH = re.compile(r"^received \d+ results from command ")


def session_lost_behind_pooler(error: BaseException) -> bool:
    """Whether ``error`` is psycopg's protocol mismatch on a connection the pooler then closed."""
    try:
        import psycopg
    except ImportError:  # a SQLite-only installation
        return False
    if not isinstance(error, psycopg.InternalError) or getattr(error, "sqlstate", None):
        return False
    if not RESULTS_MISMATCH.match(str(error)):
        return False
    raised_on = _connection_that_raised(error.__traceback__, psycopg)
    return raised_on is not None and bool(raised_on.closed)


def _connection_that_raised(traceback: TracebackType | None, psycopg: Any) -> Any:
    """The innermost psycopg connection in ``traceback``: ``self`` of a connection's
    method, or the connection of a cursor whose method it is."""
    found = None
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if isinstance(candidate, psycopg.BaseConnection):
            found = candidate
        elif isinstance(candidate, (psycopg.Cursor, psycopg.AsyncCursor)):
            found = candidate.connection
        traceback = traceback.tb_next
    return found
