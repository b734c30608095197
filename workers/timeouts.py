"""The local worker's side of per-job timeouts (``jobs.timeouts`` has the transitions).

At a job's deadline (its start plus ``timeout_seconds``, on the worker's
monotonic clock) the worker's main loop, not the job's thread:

1. fails the job with ``JobTimeout`` (``job.timeout``), fenced by its lease
   token, keeping on the event where the job's thread stood at that moment;
2. sets the run's cancel event: ``ctx.cancelled`` turns true,
   ``ctx.wait_cancelled`` returns, ``ctx.emit`` raises ``JobCancelled``, so
   cooperative code stops;
3. frees the job's slot at once: the run is *abandoned* and a fresh thread
   takes its place in the pool, so the worker claims other work while the
   old thread is still running. Whatever that thread returns or raises later
   is dropped (and a write would be refused anyway: the job no longer has
   that lease token).

A thread that never looks at its context cannot be stopped: Python has no
way to kill a thread. It runs until its code returns, then ends (it does not
go back to the pool). A worker abandons at most ``concurrency`` runs at a
time; past that, a timed-out run keeps its slot until it returns, so stuck
code cannot grow a worker's threads (and connections) without bound. Under
``runworker --processes N`` the supervisor stops a child (SIGTERM, its other
jobs get the shutdown grace; SIGKILL if it outlives that) once a run it
abandoned has gone on for ``TIMEOUT_KILL_GRACE_SECONDS``, and starts a
replacement: the only way to reclaim a thread that never looks. The child
reports the oldest abandonment time through a shared memory word
(``report_to``/``report_abandoned``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import sys
import traceback

from jobs.exceptions import LeaseLost
from jobs.timeouts import TIMEOUT_ERROR_CODE, time_out_job, timeout_message
from workers.execution import STOP_TIMEOUT, InFlight
from workers.resilience import with_db_retry

log = logging.getLogger("workers")

# Set in a child of ``runworker --processes``: where its oldest abandonment time goes.
_sink: ctypes.c_double | None = None


def report_to(sink: ctypes.c_double | None) -> None:
    """Send ``report_abandoned`` values to ``sink`` (shared with the supervisor), or nowhere."""
    global _sink
    _sink = sink


def report_abandoned(since: float) -> None:
    """Publish when (``time.monotonic()``) the oldest abandoned run still going was abandoned;
    0 when none is. CLOCK_MONOTONIC is one clock for every process of the machine."""
    if _sink is not None:
        _sink.value = since


def stack_of(flight: InFlight) -> str:
    """Where the run's thread stands now, formatted like a traceback ("" if it is gone)."""
    frame = sys._current_frames().get(flight.thread_id or -1)
    if frame is None:
        return ""
    timeout = flight.job.timeout_seconds or 0.0
    return (
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_stack(frame))
        + f"{TIMEOUT_ERROR_CODE}: {timeout_message(timeout)}\n"
    )


def time_out_flight(flight: InFlight) -> bool:
    """Fail the flight's job with ``JobTimeout`` and tell its run to stop.

    Returns True when this worker recorded the timeout; False when the job
    had already left its hands (finished, cancelled, reaped), in which case
    the run is told to stop all the same. A database error that outlives the
    retries propagates: the worker's loop backs off and tries again.
    """
    job = flight.job
    flight.timed_out = True
    try:
        with_db_retry(
            functools.partial(
                time_out_job,
                job.id,
                lease_token=job.lease_token,
                timeout_seconds=job.timeout_seconds or 0.0,
                traceback=stack_of(flight),
            ),
            what="time_out",
            attempts=3,
        )
    except LeaseLost as lost:
        log.info("job.not_timed_out job_id=%s status=%s (no longer held)", job.id, lost.status)
        flight.cancel.set()
        return False
    except BaseException:
        flight.timed_out = False  # try again on the next pass
        raise
    flight.stop_reason = STOP_TIMEOUT  # before ``cancel``: the run reads it after
    flight.cancel.set()
    log.warning(
        "job.timeout job_id=%s operation=%s queue=%s attempt=%d timeout=%gs",
        job.id,
        job.operation,
        job.queue,
        job.attempt,
        job.timeout_seconds or 0.0,
    )
    return True
