"""Reads that people wait for (dashboard pages, API lists, ``/metrics``) from a streaming replica.

With ``DATABASE_REPLICA_URL`` set, settings add a ``replica`` database alias,
``ReplicaRouter`` and ``StickyPrimaryMiddleware``. Nothing reads the replica
unless it asks to: a read-only view runs under ``on_replica`` (the dashboard's
``page``, the API's ``bounded`` list views and ``/metrics`` do), and only the
ORM reads and ``read_connection()`` cursors inside it go to the replica.
Everything else stays on the primary: claims, transitions, enqueue, the job
and event reads of one job, WebSockets, the worker and the reaper.

Inside the scope the primary still answers when the replica's answer could be
wrong or missing:

- the replica lags more than ``REPLICA_MAX_LAG_SECONDS`` (measured on the
  replica, remembered ``REPLICA_CHECK_SECONDS``) or cannot be reached;
- the same browser or API client sent a write (POST, PATCH, DELETE…) less than
  ``REPLICA_STICKY_SECONDS`` ago (a cookie), so the page an operator action
  redirects to shows the change;
- the request already wrote, or the default database is inside a transaction
  (read-after-write);
- the replica fails during the read: it is marked down and the read runs
  again on the primary.

Without the setting none of this is installed and ``on_replica`` just calls
through (SQLite, the zero-setup default, included).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, router
from django.db import InterfaceError as DjangoInterfaceError
from django.http import HttpRequest, HttpResponse

from jobs.conf import knob
from jobs.selectors.timeouts import is_timeout

REPLICA = "replica"
STICKY_COOKIE = "controlplane_primary_until"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

# Replication delay in seconds: 0 when everything received is replayed and the
# WAL receiver is connected (an idle primary sends nothing, which is not lag);
# otherwise the age of the last replayed commit, NULL (too stale) when nothing
# was replayed yet. A server that is not in recovery is its own primary.
LAG_SQL = """
SELECT CASE
  WHEN NOT pg_is_in_recovery() THEN 0
  WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
       AND EXISTS (SELECT 1 FROM pg_stat_wal_receiver WHERE pid IS NOT NULL) THEN 0
  ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())
END
"""


@dataclass
class _Scope:
    """The read scope of one ``on_replica`` call: where its reads go, and whether it wrote."""

    alias: str
    wrote: bool = False


_scope: ContextVar[_Scope | None] = ContextVar("controlplane_replica_scope", default=None)


def configured() -> bool:
    """True when this process has a ``replica`` alias and routes through ``ReplicaRouter``."""
    return REPLICA in connections.settings and any(
        isinstance(each, ReplicaRouter) for each in router.routers
    )


# --- health: is the replica there and fresh enough? ---------------------------------


@dataclass(frozen=True)
class Health:
    checked_at: float
    lag: float | None  # seconds; None: unreachable or nothing replayed yet
    error: str = ""

    def fresh_enough(self, max_lag: float) -> bool:
        return self.lag is not None and self.lag <= max_lag


_health: Health | None = None
_health_lock = threading.Lock()


def measure_lag() -> float | None:
    """The replica's replication delay in seconds (one query on the replica), None if unknown."""
    with connections[REPLICA].cursor() as cursor:
        cursor.execute(LAG_SQL)
        value = cursor.fetchone()[0]
    return None if value is None else max(0.0, float(value))


def health() -> Health:
    """The replica's last known lag, measured again when older than ``REPLICA_CHECK_SECONDS``.

    One thread per process measures at a time; the others meanwhile go on
    with the last measure (the primary when there is none), so a replica
    that hangs holds up one request, not the process. A replica that cannot
    be reached counts as too stale until the next check.
    """
    global _health
    current = _health
    now = time.monotonic()
    if current is not None and now - current.checked_at < float(knob("REPLICA_CHECK_SECONDS")):
        return current
    if not _health_lock.acquire(blocking=False):
        return current or Health(now, None, "The replica is being measured.")
    try:
        try:
            _health = Health(now, measure_lag())
        except (OperationalError, DjangoInterfaceError) as error:
            connections[REPLICA].close()
            _health = Health(now, None, str(error).strip())
        return _health
    finally:
        _health_lock.release()


def mark_down(error: BaseException) -> None:
    """Send reads to the primary until the next check (the replica just failed a read)."""
    global _health
    _health = Health(time.monotonic(), None, str(error).strip())


def forget() -> None:
    """Drop the remembered health (tests; a process that knows the replica changed)."""
    global _health
    _health = None


# --- choosing where a scope reads ---------------------------------------------------


def primary_pinned(request: HttpRequest | None) -> bool:
    """True while this client's last write is younger than ``REPLICA_STICKY_SECONDS``."""
    if request is None:
        return False
    try:
        until = float(request.COOKIES.get(STICKY_COOKIE, "0"))
    except ValueError:
        return False
    return until > time.time()


def choose_alias(request: HttpRequest | None = None) -> str:
    """Where a read-only view's reads go: the replica when usable and fresh, else the primary."""
    if not configured() or connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS
    if primary_pinned(request):
        return DEFAULT_DB_ALIAS
    if not health().fresh_enough(float(knob("REPLICA_MAX_LAG_SECONDS"))):
        return DEFAULT_DB_ALIAS
    return REPLICA


def read_alias() -> str:
    """The alias reads of the current scope use right now (the primary outside any scope)."""
    scope = _scope.get()
    if scope is None or scope.alias != REPLICA or scope.wrote:
        return DEFAULT_DB_ALIAS
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS  # a transaction on the primary reads its own writes
    return REPLICA


def read_connection() -> Any:
    """The connection for a raw-SQL read: the scope's replica or the primary."""
    return connections[read_alias()]


@contextmanager
def reading(alias: str) -> Iterator[str]:
    """Route the enclosed ORM reads to ``alias`` (through ``ReplicaRouter``)."""
    token = _scope.set(_Scope(alias))
    try:
        yield alias
    finally:
        _scope.reset(token)


def _replica_failed(error: BaseException) -> bool:
    """A connection loss or a recovery conflict on the replica, not a statement timeout."""
    return isinstance(error, OperationalError | DjangoInterfaceError) and not is_timeout(error)


def on_replica[T](read: Callable[[], T], request: HttpRequest | None = None) -> T:
    """Run the read-only ``read`` with its reads on the replica when that is safe.

    ``read`` must not change anything: when the replica fails part-way it is
    marked down and ``read`` runs again, on the primary.
    """
    alias = choose_alias(request)
    if alias == DEFAULT_DB_ALIAS:
        return read()
    try:
        with reading(REPLICA):
            return read()
    except (OperationalError, DjangoInterfaceError) as error:
        if not _replica_failed(error):
            raise
        mark_down(error)
        connections[REPLICA].close()
    return read()


# --- Django's hooks -----------------------------------------------------------------


class ReplicaRouter:
    """Reads inside an ``on_replica`` scope go to the replica; every write goes to the primary.

    A write inside the scope ends its replica reads (read-after-write). An
    object read from the replica is saved, and its relations are read, on
    the primary.
    """

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        alias = read_alias()
        if alias == REPLICA:
            return REPLICA
        if _from_replica(hints):
            return DEFAULT_DB_ALIAS
        return None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        scope = _scope.get()
        if scope is not None:
            scope.wrote = True
        if scope is not None or _from_replica(hints):
            return DEFAULT_DB_ALIAS
        return None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        both = {obj1._state.db, obj2._state.db}
        return True if both <= {DEFAULT_DB_ALIAS, REPLICA} else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == REPLICA else None


def _from_replica(hints: dict[str, Any]) -> bool:
    instance = hints.get("instance")
    return instance is not None and instance._state.db == REPLICA


class StickyPrimaryMiddleware:
    """After a client's write, its reads stay on the primary for ``REPLICA_STICKY_SECONDS``.

    The cookie goes with every response to a non-safe method (a dashboard
    action's redirect included), so the page that follows shows the change
    even while the replica is still replaying it. Sync and async capable: a
    parked long-poll holds no thread for it.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        return self.pin(request, self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self.pin(request, await self.get_response(request))

    @staticmethod
    def pin(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        seconds = float(knob("REPLICA_STICKY_SECONDS"))
        if request.method not in SAFE_METHODS and seconds > 0:
            response.set_cookie(
                STICKY_COOKIE,
                f"{time.time() + seconds:.3f}",
                max_age=max(1, int(seconds + 0.999)),
                httponly=True,
                samesite="Lax",
            )
        return response
