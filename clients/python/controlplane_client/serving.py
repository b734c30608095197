"""Auto-serve: a claim loop feeding a pool of ``concurrency`` threads that run and report jobs."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx

from controlplane_client.api import ApiError, LeaseLostError
from controlplane_client.jobs import ClaimedJob, Deferred
from controlplane_client.logs import current_job
from controlplane_client.tracing import run_traced

if TYPE_CHECKING:
    from controlplane_client.manager import JobManager

log = logging.getLogger("controlplane_client")


class AutoServe:
    """Claims while a slot is free, runs each job with the manager's handler, reports it.

    The claim loop sleeps on the manager's ``task ready`` event (set by a
    push) with the polling interval as the timeout, or long-polls the server
    when no push channel is up; a failing server is retried with backoff.
    """

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager
        self._pool = concurrent.futures.ThreadPoolExecutor(
            manager.concurrency, thread_name_prefix="controlplane-job"
        )
        self._futures: set[concurrent.futures.Future[None]] = set()
        self._lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="controlplane-claim", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def running(self) -> int:
        with self._lock:
            return len(self._futures)

    def drain(self, grace: float) -> None:
        """Let running jobs finish within ``grace`` seconds (the manager has set its stop event)."""
        with self._lock:
            running = list(self._futures)
        concurrent.futures.wait(running, timeout=grace)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._thread.join(timeout=0.5)  # a long-poll in flight ends on its own

    # --- the claim loop -------------------------------------------------------
    def _loop(self) -> None:
        m = self.manager
        failures = 0
        while not m._stop.is_set():
            free = m.concurrency - self.running()
            if free <= 0:
                self._slot_freed.wait(0.5)
                self._slot_freed.clear()
                continue
            m._task_ready.clear()
            wait = m.claim_wait()
            started = time.monotonic()
            try:
                jobs = m.claim(free, wait)
                failures = 0
            except (httpx.HTTPError, ApiError) as error:
                failures += 1
                log.warning("claim failed: %s", error)
                m._stop.wait(min(30.0, m.interval() * 2 ** min(failures, 5)))
                continue
            if m._stop.is_set():
                break  # disconnect() is requeueing what we hold, these included
            for job in jobs:
                self._submit(job)
            if not jobs and (wait == 0 or time.monotonic() - started < wait / 2):
                m._task_ready.wait(m.interval())

    def _submit(self, job: ClaimedJob) -> None:
        future = self._pool.submit(self._run, job)
        with self._lock:
            self._futures.add(future)

        def done(f: concurrent.futures.Future[None]) -> None:
            with self._lock:
                self._futures.discard(f)
            self._slot_freed.set()

        future.add_done_callback(done)

    # --- one job ----------------------------------------------------------------
    def _dispatch(self, job: ClaimedJob) -> Any:
        """Run the job's handler, inside its run span when OpenTelemetry is installed;
        what it logs in this thread goes to the job's log (``JobLogHandler``)."""
        token = current_job.set(job)
        try:
            return run_traced(job, self._call)
        finally:
            current_job.reset(token)

    def _call(self, job: ClaimedJob) -> Any:
        m = self.manager
        if m.execute is not None:
            return m.execute(job)
        handler = m._handlers.get(job.operation)
        if handler is None:
            raise LookupError(f"This worker has no handler for operation {job.operation!r}.")
        return handler(job)

    def _run(self, job: ClaimedJob) -> None:
        m = self.manager
        try:
            outcome = self._dispatch(job)
        except LeaseLostError as error:
            log.info("job %s stopped: %s", job.id, error.message)
            if not job.timed_out:  # a timed-out job stays held until the heartbeat settles it
                m.forget(job.id, "lost")
            return
        except Exception as error:  # noqa: BLE001 - the operation's failure is the job's
            failure = error
            self._report(job, lambda: m.fail(job, failure))
            return
        deferred = isinstance(outcome, Deferred)
        result = outcome.result if deferred else outcome
        try:
            json.dumps(result)
        except (TypeError, ValueError) as error:
            message = f"The operation returned a result that is not JSON: {error}"
            self._report(job, lambda: m.fail(job, message, error_code="InvalidResult"))
            return
        self._report(job, lambda: m.complete(job, result, deferred=deferred))

    def _report(self, job: ClaimedJob, send: Any) -> None:
        try:
            send()
        except Exception as error:  # noqa: BLE001 - the lease expires and the job is requeued
            log.error("job %s: the outcome could not be reported: %s", job.id, error)
            self.manager.forget(job.id, "lost")
