"""A second connection per thread, for writes that must commit on their own.

``emit`` from inside an operation's open transaction must be visible at once,
and a job must still be marked failed when the execute session cannot commit.
Both use this thread's independent connection, registered under its own alias
so the usual ``using=`` arguments work. It is opened once per thread and kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

ALIAS = "independent"


@contextmanager
def independent_connection(base: str = "default") -> Iterator[str]:
    """Yield the alias of this thread's independent connection to ``base``."""
    try:
        conn = connections[ALIAS]
    except Exception:  # noqa: BLE001 - not yet created in this thread
        conn = None
    if conn is None or conn.settings_dict is not connections[base].settings_dict:
        conn = connections.create_connection(base)
        connections[ALIAS] = conn
    try:
        yield ALIAS
    except Exception:
        if conn.connection is not None and not conn.is_usable():
            conn.close()
        raise
