"""Running behind a transaction pooler (PgBouncer ``pool_mode = transaction``).

A transaction pooler hands each transaction whichever server connection is
free, so nothing may outlive a transaction on a pooled connection. Most of the
control plane already works that way (every claim, transition and read is one
transaction); what does not is routed here:

==============================  ==================================================
needs a session                 what it does behind the pooler
==============================  ==================================================
``LISTEN`` (worker wake-ups,    a DIRECT connection (``DATABASE_DIRECT_URL``);
dashboard live relay, remote    without one, no LISTEN: workers and relays poll
long-poll wake-ups)             (``POLL_SECONDS``), which they do anyway
worker liveness lock (session   held on that same direct connection; without one
advisory lock)                  leases and heartbeats decide, as with ``POLL_ONLY``
server-side prepared            ``prepare_threshold = None`` (Django's psycopg
statements                      default, forced here in case OPTIONS changed it)
server-side cursors             ``DISABLE_SERVER_SIDE_CURSORS = True``
(``QuerySet.iterator()``)
``SET`` of a GUC                only ``SET LOCAL`` / ``set_config(…, true)`` inside
                                a transaction (the code base has no other)
==============================  ==================================================

``NOTIFY`` (``pg_notify`` at enqueue), ``pg_advisory_xact_lock`` (concurrency
caps) and ``SET LOCAL`` (statement timeouts of reads) end with their
transaction and go through the pooler unchanged.

Configuration lives in the ``DATABASES`` entry, so a host project sets it the
same way (``configure_database``): ``POOLER`` (``"none"`` or
``"transaction"``) and ``DIRECT`` (the parts of a URL that reach PostgreSQL
itself). Without either, nothing changes: the session connections use the
same parameters as every other.
"""

from __future__ import annotations

from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

NO_POOLER = "none"
TRANSACTION_POOLER = "transaction"
POOLERS = (NO_POOLER, TRANSACTION_POOLER)

# The parts of the direct URL that replace the pooled connection's own.
_DIRECT_PARTS = {"HOST": "host", "PORT": "port", "USER": "user", "PASSWORD": "password"}
# Client-side options that mean nothing to a plain psycopg session connection.
_CLIENT_ONLY_OPTIONS = ("cursor_factory", "context", "prepare_threshold", "server_side_binding")


def configure_database(
    config: dict[str, Any], *, direct_url: str | None = None, pooler: str | None = None
) -> dict[str, Any]:
    """Adjust a PostgreSQL ``DATABASES`` entry for the pooler in front of it (in place).

    ``pooler`` is ``"transaction"`` or ``"none"``; unset, it is ``"transaction"``
    exactly when ``direct_url`` reaches another server than ``config`` (a
    direct URL means the main one goes through a pooler). Transaction pooling
    turns off what cannot cross transactions: prepared statements and
    server-side cursors. ``direct_url`` is where session connections go.
    """
    direct = dict(dj_database_url.parse(direct_url)) if direct_url else None
    mode = (pooler or "").strip().lower()
    if not mode:
        mode = TRANSACTION_POOLER if direct and _other_server(direct, config) else NO_POOLER
    if mode not in POOLERS:
        raise ImproperlyConfigured(
            f"CONTROLPLANE_DB_POOLER must be one of {', '.join(POOLERS)}, not {pooler!r}."
        )
    config["POOLER"] = mode
    if mode == TRANSACTION_POOLER:
        config["DISABLE_SERVER_SIDE_CURSORS"] = True
        config.setdefault("OPTIONS", {})["prepare_threshold"] = None
    if direct:
        config["DIRECT"] = {
            **{key: direct.get(key) for key in (*_DIRECT_PARTS, "NAME")},
            # The name DATABASE_URL gave: a different NAME now is a test database.
            "POOLED_NAME": config.get("NAME"),
        }
    return config


def _other_server(direct: dict[str, Any], config: dict[str, Any]) -> bool:
    return (direct.get("HOST"), str(direct.get("PORT") or "")) != (
        config.get("HOST"),
        str(config.get("PORT") or ""),
    )


def is_transaction_pooled(alias: str = "default") -> bool:
    """Whether ``alias`` goes through a transaction pooler (no session state survives)."""
    from django.db import connections

    return connections[alias].settings_dict.get("POOLER") == TRANSACTION_POOLER


def session_conninfo(alias: str = "default") -> dict[str, Any] | None:
    """psycopg ``connect()`` keywords for a connection that keeps its session.

    For ``LISTEN`` and session advisory locks. The direct URL's host, port,
    user and password replace the pooled ones where it gives them; its database
    name too, unless the connection now uses another name than it was
    configured with (the tests' database). None when ``alias`` is transaction
    pooled and no direct URL is set: there is no session to be had.
    """
    from django.db import connections

    wrapper = connections[alias]
    settings = wrapper.settings_dict
    params = wrapper.get_connection_params()
    for key in _CLIENT_ONLY_OPTIONS:
        params.pop(key, None)
    direct = settings.get("DIRECT")
    if not direct:
        return None if settings.get("POOLER") == TRANSACTION_POOLER else params
    for key, param in _DIRECT_PARTS.items():
        if direct.get(key):
            params[param] = direct[key]
    if direct.get("NAME") and settings.get("NAME") == direct.get("POOLED_NAME"):
        params["dbname"] = direct["NAME"]
    return params


def direct_url(alias: str = "default") -> str | None:
    """``alias``'s direct URL for a child process (with the database name now in use), or None.

    Test sessions hand their processes the test database; the direct URL of
    the environment still names the configured one.
    """
    from urllib.parse import quote

    from django.db import connections

    params = session_conninfo(alias)
    if params is None or not connections[alias].settings_dict.get("DIRECT"):
        return None
    user = quote(str(params.get("user") or ""), safe="")
    password = quote(str(params.get("password") or ""), safe="")
    auth = f"{user}{':' + password if password else ''}@" if user else ""
    host = params.get("host") or "127.0.0.1"
    port = params.get("port") or 5432
    return f"postgres://{auth}{host}:{port}/{quote(str(params['dbname']), safe='')}"
