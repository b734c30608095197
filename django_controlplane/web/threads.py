"""The web process's threads for synchronous code: a fixed number, shared by every request.

Under ASGI, Django runs the synchronous parts of each request (sync views, and
the sync middleware around async ones) on a thread created for that request.
Each such thread opens its own database connection, so one process held 99
PostgreSQL connections with 16 clients, and every request paid for a new
thread and a new connection.

Here every piece of synchronous code a web request runs goes to one
``ThreadPoolExecutor`` of ``WEB_THREADS`` threads (two by default: see below).
A request waits for a free
thread at most ``WEB_QUEUE_TIMEOUT_SECONDS``; past that (or when more than
``WEB_MAX_WAITING`` requests already wait) it is answered 503 with
``Retry-After``, so an overload degrades into clean refusals instead of
piling up. Database connections come from Django's connection pool
(``django_controlplane.host_settings``), which is at least as large as this pool, so a
thread never waits for a connection in normal operation.

Why two threads: the work of a request here is Python, and threads of one
process take turns on the GIL, unfairly, so many threads starve some
requests (8 threads: p99 near 1 s). But with one thread, a request that waits
on PostgreSQL (an enqueue's INSERT and its commit) leaves the process idle
meanwhile. Measured on 2 cores with one process per core (``bench/web.py
--host-project``, 32 clients, quiet machine), two threads against one: events
2,145 against 1,957 req/s (p99 30 ms against 28), ``POST /jobs`` 1,489 against
1,254, the list 1,287 against 1,250, and ahead of gunicorn's 16 threads on
every row. Waiting is done without a thread anyway (parked long-polls, the
event loop's I/O). Raise ``WEB_THREADS`` only for views that wait on slow I/O.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from django_controlplane.host_settings import DEFAULT_WEB_THREADS

DEFAULT_QUEUE_TIMEOUT_SECONDS = 5.0
DEFAULT_MAX_WAITING = 2048


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(f"CONTROLPLANE_{name}")
    return float(raw) if raw not in (None, "") else default


def configured_threads() -> int:
    """Threads per web process: settings ``WEB_THREADS`` (env ``CONTROLPLANE_WEB_THREADS``)."""
    from django.conf import settings

    configured = getattr(settings, "WEB_THREADS", None)
    return max(1, int(configured or _env_number("WEB_THREADS", DEFAULT_WEB_THREADS)))


class Busy(Exception):
    """Every thread of this web process stayed busy for the whole queue timeout."""


class WebThreads:
    """A bounded executor with an admission queue in front of it (one per process)."""

    def __init__(
        self,
        size: int | None = None,
        *,
        queue_timeout: float | None = None,
        max_waiting: int | None = None,
    ) -> None:
        self.size = size or configured_threads()
        self.queue_timeout = (
            queue_timeout
            if queue_timeout is not None
            else _env_number("WEB_QUEUE_TIMEOUT_SECONDS", DEFAULT_QUEUE_TIMEOUT_SECONDS)
        )
        self.max_waiting = int(
            max_waiting
            if max_waiting is not None
            else _env_number("WEB_MAX_WAITING", DEFAULT_MAX_WAITING)
        )
        self.executor = ThreadPoolExecutor(self.size, thread_name_prefix="web")
        self.in_flight = 0  # calls running or queued for a thread
        self.paced_waiting = 0  # async views' steps waiting for their turn (``run``)
        self._paced: asyncio.Semaphore | None = None
        self._paced_loop: asyncio.AbstractEventLoop | None = None

    async def call[T](self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` on one of the threads, first come first served.

        The call goes straight into the executor's queue, so a thread that
        finishes one request starts the next at once instead of waiting for
        the event loop to hand it over. A call that no thread has started
        within the queue timeout is taken back out of the queue and raises
        ``Busy``; so does one that finds ``max_waiting`` calls already queued.
        """
        if self.in_flight >= self.size + self.max_waiting:
            raise Busy
        self.in_flight += 1
        try:
            submitted = self.executor.submit(contextvars.copy_context().run, function, *args)
            result = asyncio.wrap_future(submitted)
            done, _ = await asyncio.wait({result}, timeout=self.queue_timeout)
            if not done and submitted.cancel():
                raise Busy
            return await result
        finally:
            self.in_flight -= 1

    async def run[T](self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``function`` on one of the threads and hand its connections back afterwards.

        For the blocking steps of async views: the connection it used returns
        to the pool at once, so nothing is held while the view awaits.

        These steps are paced: at most one per thread is handed over at a
        time, the next only once the event loop has taken the last one's
        result. A thousand long-polls answered at once come back as a thousand
        claim attempts; queued all together they kept the thread busy and the
        loop, which has to send the answers and read the next requests, short
        of turns (measured: their p99 about 140 ms later). Sync requests still
        go straight into the queue (``call``). A step waits for its turn at
        most the queue timeout, then once more at most that long in the
        queue, and past ``max_waiting`` waiting steps it is refused at once:
        ``Busy`` either way.
        """
        step = functools.partial(_returning_connections, function, *args, **kwargs)
        paced = self._pacing()
        if paced.locked() and self.paced_waiting >= self.max_waiting:
            raise Busy
        self.paced_waiting += 1
        try:
            await asyncio.wait_for(paced.acquire(), self.queue_timeout)
        except TimeoutError:
            raise Busy from None
        finally:
            self.paced_waiting -= 1
        try:
            return await self.call(step)
        finally:
            paced.release()

    def _pacing(self) -> asyncio.Semaphore:
        # One per event loop: a server has one, but tests run each async call in a new loop.
        loop = asyncio.get_running_loop()
        if self._paced is None or self._paced_loop is not loop:
            self._paced, self._paced_loop = asyncio.Semaphore(self.size), loop
        return self._paced


def _returning_connections[T](function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return function(*args, **kwargs)
    finally:
        connections.close_all()


_threads: WebThreads | None = None
# Set by the dispatcher for the requests it serves (see ``run_blocking``).
serving: contextvars.ContextVar[WebThreads | None] = contextvars.ContextVar(
    "controlplane_web_threads", default=None
)


async def run_blocking[T](function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking step of an async view: on the web threads when a server serves it.

    Outside ``django_controlplane.web.dispatch`` (Django's test client, a plain ``runserver``)
    it runs where Django runs sync code, which is what tests with a
    transaction need: the test's own connection, in the test's thread.
    """
    threads = serving.get()
    if threads is None:
        return await sync_to_async(function, thread_sensitive=True)(*args, **kwargs)
    return await threads.run(function, *args, **kwargs)


def web_threads() -> WebThreads:
    """This process's threads (made on first use, in the server's event loop)."""
    global _threads
    if _threads is None:
        _threads = WebThreads()
    return _threads
