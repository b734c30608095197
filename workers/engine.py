"""The worker: claim in batches sized to free slots, run in threads, finish in batches.

One main thread loops: gather the completions of a batch (until every running
job has finished, or ``GATHER_SECONDS`` passed since the first one), write them
and claim up to the free slots, hand the claimed work to the thread pool, then
sleep until woken (a NOTIFY, a finished job, a signal) or until
``POLL_SECONDS`` pass.

On PostgreSQL, when every open served queue is an uncapped job queue, the
completions, the claim and both kinds of events are one statement
(``complete_and_claim``): one commit per cycle. Otherwise the completions are
one statement and each queue group's claim another.

A local worker claims every job of its queues except those of operations
that only remote workers provide (live ``RemoteOperation`` rows its registry
lacks): those stay queued for them, while a job of an operation nobody
provides is still claimed and failed with ``UnknownOperation``.

Logging: ``job.claimed`` and ``job.succeeded`` are per-job lines at DEBUG
(``CONTROLPLANE_LOG_LEVEL=DEBUG``); failures, retries, requeues and lost
leases stay at INFO/WARNING. The events table records every transition
whatever the level.

Connection budget per worker process (size fleets against ``max_connections``):
one for the main loop, one per concurrent job thread, one for the heartbeat,
one for the LISTEN connection on PostgreSQL: ``concurrency + 3``. Atomic
operations that ``emit`` add one independent connection per job thread.
Behind PgBouncer in transaction mode (``jobs.pooling``) all but the LISTEN
connection are pooler clients, which share the pooler's few server
connections; the LISTEN connection goes to ``DATABASE_DIRECT_URL``, or does
not exist (``POLL_ONLY``, or no direct URL): docs/deploying.md, "Connection budget".
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from queue import SimpleQueue

from django.db import DataError, connection

from jobs import signals, transitions
from jobs.batches import claim_messages
from jobs.claims import (
    ClaimedJob,
    Completion,
    Handoff,
    claim_jobs,
    complete_and_claim,
    complete_followed,
    complete_jobs,
    extend_leases,
    left_out,
)
from jobs.clock import check_skew, db_now
from jobs.exceptions import LeaseLost
from jobs.independent import independent_connection
from jobs.key_limits import apply_declared_limits
from jobs.keyed_claims import claim_keyed, keyed_pick, settled
from jobs.logging_json import state_line_level
from jobs.models import QueueKind, Worker, WorkerKind
from jobs.operations import OperationRegistry
from jobs.operations import registry as default_registry
from jobs.queue_limits import (
    QueueSettings,
    apply_configured_queues,
    configured_queues,
    queue_settings,
)
from jobs.rate_limits import TokenWaits, claim_rate_limited
from workers.batch_runner import MessageFlight, extend_visibility, release_messages, run_message
from workers.config import WorkerConfig
from workers.execution import STOP_SHUTDOWN, InFlight, JobRunner
from workers.heartbeat import HeartbeatLoop
from workers.holding import HoldOff, NotNow
from workers.listener import NotifyListener, can_listen
from workers.resilience import backoff_delay, is_transient, reset_connection, with_db_retry
from workers.shutdown import EXIT_GRACE_RAN_OUT, EXIT_GRACEFUL, ShutdownGuard
from workers.timeouts import report_abandoned, time_out_flight

log = logging.getLogger("workers")

Flight = InFlight | MessageFlight

# What a batched success write raises for one job's values (a number outside
# its column, text the database refuses): that job fails, the others are written.
_VALUE_ERRORS = (DataError, ValueError, TypeError, OverflowError)

# How long the main loop waits, after the first job of a batch finished, for
# the rest of the batch before it writes the completions and claims again:
# fuller claims, fewer commits, at most this much added to a job's finish.
GATHER_SECONDS = 0.005


def _is_followed(flight: object) -> bool:
    """A run of a job whose success releases others (``ClaimedJob.followed``)."""
    return isinstance(flight, InFlight) and flight.job.followed


class JobThreads:
    """``size`` threads fed by one queue: handing a job over is one C call.

    ``ThreadPoolExecutor.submit`` builds a Future, a work item and takes a
    semaphore per job: 15% of the main loop's CPU at a few thousand jobs a
    second, for results nobody reads (each run reports through the worker).

    Threads start with the first jobs handed over, one per job until there
    are ``size``, as ``ThreadPoolExecutor`` starts its own: starting 32
    before the first claim put about 12 ms of thread hand-shakes (wall time,
    a busy two-core machine) between a worker's exec and its first claim.
    """

    def __init__(self, size: int, run: Callable[[object, Flight], None]) -> None:
        self._run = run
        self._queue: SimpleQueue = SimpleQueue()
        self._size = size
        self._threads: list[threading.Thread] = []
        self._started = 0  # of the ``size`` threads; replacements (``add_thread``) not counted
        self._spawned = 0  # every thread ever started, for names
        self._lock = threading.Lock()

    def _spawn(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"job_{self._spawned}", daemon=True)
        self._spawned += 1
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def add_thread(self) -> None:
        """One more thread, in place of one whose run the worker abandoned (a timeout).

        That thread leaves the pool when its run returns (``_serve``), so the
        pool keeps ``size`` threads free for new jobs either way.
        """
        with self._lock:
            self._spawn()

    def submit(self, key: object, flight: Flight) -> None:
        self._queue.put((key, flight))
        if self._started < self._size:
            with self._lock:
                if self._started < self._size:
                    self._started += 1
                    self._spawn()

    def shutdown(self, *, wait: bool) -> None:
        """Stop every thread once its current run ends; ``wait`` joins them."""
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                if thread.is_alive():
                    thread.join()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._run(*item)
            except BaseException as error:  # noqa: BLE001 - a thread must outlive one broken run
                log.error("worker.thread_error key=%s", item[0], exc_info=error)
            if getattr(item[1], "abandoned", 0.0):
                return  # replaced by ``add_thread`` when its run was abandoned


class JobWorker:
    """Serves job queues and batch queues alike; each queue's kind decides.

    Subclass and override the hooks (PreDequeue / PreHandle /
    PostHandle) to add a budget or per-job set-up.
    """

    def __init__(self, config: WorkerConfig, *, registry: OperationRegistry | None = None) -> None:
        self.config = config
        self.id = uuid.UUID(config.worker_id) if config.worker_id else uuid.uuid4()
        self.wake = threading.Event()
        self.guard = ShutdownGuard(
            self.wake,
            grace_seconds=config.shutdown_grace_seconds,
            cleanup_seconds=config.shutdown_cleanup_seconds,
        )
        self._lock = threading.Lock()
        self._flights: dict[object, Flight] = {}
        self._completions: list[Completion] = []
        # Timed-out runs whose threads still run (``workers.timeouts``); at most
        # ``concurrency``. The next deadline of a flight, for the main loop.
        self._abandoned: dict[object, InFlight] = {}
        self._next_deadline = math.inf
        self._pool = JobThreads(config.concurrency, self._execute)
        self._registry = registry or default_registry
        self._runner = JobRunner(
            self._registry,
            retry_backoff_seconds=config.retry_backoff_seconds,
            retry_backoff_max_seconds=config.retry_backoff_max_seconds,
            max_outage_requeues=config.max_outage_requeues,
            pre_handle=self.pre_handle,
            post_handle=self.post_handle,
        )
        # Per served queue; see ``_settings``.
        self._queue_settings: dict[str, QueueSettings] = {}
        self._token_waits = TokenWaits()
        self._key_token_due = math.inf  # monotonic: when a key's next token is due
        self._queue_settings_read = 0.0
        self._fused = connection.vendor == "postgresql"
        self._local_operations = tuple(self._registry.names())
        self._listener: NotifyListener | None = None
        self._heartbeat = HeartbeatLoop(self._beat, interval_seconds=config.heartbeat_seconds)
        # A ``NotNow`` from ``pre_dequeue``: no claim until it ends (workers.holding).
        self._hold = HoldOff(self.id)
        # Whether an operation of the registry has ``on_success`` (read again in ``run``):
        # the batched successes build their outcomes only when it or a receiver hears them.
        self._success_hooks = signals.hooked(signals.job_succeeded, self._registry)
        # False while this host's clock is past CLOCK_SKEW_MAX_SECONDS from the
        # database's (jobs.clock): checked at registration and on each heartbeat.
        self._clock_ok = True

    # --- hooks ---------------------------------------------------------------
    def pre_dequeue(self) -> bool | NotNow:
        """Return False to skip claiming this round (a budget, a maintenance window).

        Or ``NotNow(seconds, reason)``: claim nothing for that long (the loop
        sleeps until then, and wakes for a shutdown); the reason is logged and
        shown on the dashboard's workers page (``workers.holding``).
        """
        return True

    def pre_handle(self, job: ClaimedJob) -> None:
        """Runs in the job's thread before its operation."""

    def post_handle(self, job: ClaimedJob, outcome: str) -> None:
        """Runs in the job's thread after its outcome was recorded."""

    # --- lifecycle -----------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> int:
        """Serve until stopped (or, with ``burst``, until nothing is claimable).

        Returns the exit code. The registry's names are read again here, once
        every operation module is loaded.
        """
        self._local_operations = tuple(self._registry.names())
        self._success_hooks = signals.hooked(signals.job_succeeded, self._registry)
        if install_signals:
            self.guard.install()
        configured_queues()  # a malformed CONTROLPLANE["QUEUES"] stops us before we register
        try:
            self._register()
        except Exception:
            if not self.guard.stopping.is_set():
                raise
            log.info("worker.stopped id=%s exit=0 (stopped before it could register)", self.id)
            self.guard.done()
            return EXIT_GRACEFUL
        # CONTROLPLANE["QUEUES"]: before the first claim, so a declared rate limit holds from it.
        with_db_retry(apply_configured_queues, what="queue_settings", attempts=3)
        # Limits declared with operations' keys and CONTROLPLANE["KEYS"], likewise.
        with_db_retry(apply_declared_limits, what="key_settings", attempts=3)
        self._heartbeat.start()
        if can_listen() and not self.config.poll_only:
            self._listener = NotifyListener(self.config.queues, self.wake, worker_id=self.id)
            self._listener.start()
        # The readiness line: the next statement is the first claim. ``start_cpu`` is the
        # process's CPU so far (imports, set-up, registration): what a cold start costs.
        log.info(
            "worker.started id=%s queues=%s concurrency=%d pid=%d start_cpu=%.2fs",
            self.id,
            ",".join(self.config.queues),
            self.config.concurrency,
            os.getpid(),
            time.process_time(),
        )
        code = EXIT_GRACEFUL
        try:
            self._loop()
            code = self._drain()
        finally:
            self._stop_services(code)
            self.guard.done()
        log.info("worker.stopped id=%s exit=%d", self.id, code)
        return code

    def _loop(self) -> None:
        failures = 0
        while not self.guard.stopping.is_set():
            self.wake.clear()
            try:
                self._enforce_timeouts()
                self._gather()
                claimed = self._cycle()
                failures = 0
            except Exception as error:
                if not is_transient(error):
                    raise
                delay = backoff_delay(failures)
                failures += 1
                log.warning("worker.db_unavailable delay=%.2fs error=%s", delay, error)
                reset_connection()
                self.guard.stopping.wait(delay)
                continue
            if self.config.burst and not claimed and self._idle() and not self._hold.active():
                log.info("worker.burst_done id=%s", self.id)
                return
            if claimed and self._free_slots() > 0:
                continue  # there may be more
            self.wake.wait(
                min(
                    self.config.poll_seconds,
                    self._until_next_deadline(),
                    self._until_next_token(),
                    self._hold.seconds_left(),
                )
            )

    def _drain(self) -> int:
        """Let in-flight work finish within the grace, then requeue what is left.

        A second signal (``guard.hurry``) moves the grace deadline to now.
        """
        while not self._idle() and time.monotonic() < self.guard.grace_deadline():
            self._enforce_timeouts_safely()
            self._flush_completions_safely()
            self.wake.wait(min(0.05, max(self.guard.grace_deadline() - time.monotonic(), 0)))
            self.wake.clear()
        self._flush_completions_safely()
        with self._lock:
            left = list(self._flights.values())
        if not left:
            return EXIT_GRACEFUL
        for flight in left:
            if isinstance(flight, InFlight):
                flight.stop_reason = STOP_SHUTDOWN  # before ``cancel``: the run reads it after
            flight.cancel.set()
        stopped = [f for f in left if isinstance(f, InFlight)]
        self._requeue_on_shutdown(stopped)
        release_messages([f.message.id for f in left if isinstance(f, MessageFlight)])
        self._await_stopped_runs(stopped)
        return EXIT_GRACE_RAN_OUT

    def _await_stopped_runs(self, stopped: list[InFlight]) -> None:
        """Give the runs told to stop a moment to return and log their own line (``job.stopped``).

        Bounded well inside the cleanup budget: a run that ignores its cancel
        event is left behind as before. Without it the process could exit
        before a run noticed, and the log lacked what the run itself did.
        """
        deadline = time.monotonic() + min(1.0, self.config.shutdown_cleanup_seconds / 2)
        while any(not f.done for f in stopped) and time.monotonic() < deadline:
            self.wake.wait(0.02)
            self.wake.clear()

    def _requeue_on_shutdown(self, flights: list[InFlight]) -> None:
        """Requeue each job still running (``job.requeued``); log what became of each.

        The log line is the job's fate as written, never the run's view of it:
        the run only saw its cancel event set.
        """
        reason = (
            "worker shutdown: a second signal ended the grace period"
            if self.guard.hurry.is_set()
            else "worker shutdown: the grace period ran out"
        )
        for flight in flights:
            job = flight.job
            try:
                with_db_retry(
                    # partial, not a lambda with a ``job=job`` default: it binds this
                    # job now and mypy can type it.
                    functools.partial(
                        transitions.requeue_job, job.id, lease_token=job.lease_token, reason=reason
                    ),
                    what="requeue_on_shutdown",
                    attempts=3,
                )
                log.warning("job.requeued job_id=%s reason=shutdown", job.id)
            except LeaseLost as lost:
                log.warning(
                    "job.not_requeued job_id=%s status=%s (finished, cancelled or taken over)",
                    job.id,
                    lost.status,
                )
            except Exception:  # noqa: BLE001 - cannot requeue: force-fail on a fresh connection
                try:
                    with independent_connection() as alias:
                        transitions.fail_job(
                            job.id,
                            lease_token=job.lease_token,
                            error_code="WorkerShutdown",
                            error_message="The worker shut down and could not requeue the job.",
                            using=alias,
                        )
                    log.warning(
                        "job.failed job_id=%s error_code=WorkerShutdown (could not requeue)", job.id
                    )
                except Exception:  # noqa: BLE001 - the lease expires; the reaper takes over
                    log.exception("job.shutdown_unrecorded job_id=%s", job.id)

    def _stop_services(self, code: int) -> None:
        # Nothing is held any more, so the heartbeat need not outlive the drain;
        # it no longer re-registers once stopping (see ``_beat``).
        self._heartbeat.stop(timeout=1.0)
        if self._listener is not None:
            self._listener.stop()
        try:
            Worker.objects.filter(pk=self.id).delete()
        except Exception:  # noqa: BLE001 - the reaper sweeps a worker row left behind
            log.warning("worker.unregister_failed id=%s", self.id)
        with self._lock:
            abandoned = bool(self._abandoned)
        # Never wait for an abandoned run: it may never return (daemon threads).
        self._pool.shutdown(wait=code == EXIT_GRACEFUL and not abandoned)

    # --- registration and heartbeat -------------------------------------------
    def _register(self) -> None:
        """Create (or refresh) the Worker row, waiting through an outage until told to stop.

        One ``INSERT … ON CONFLICT DO UPDATE``: a fresh worker's row never exists,
        and ``update_or_create`` took five round trips (``SELECT … FOR UPDATE``, a
        savepoint around the ``INSERT``, the commit) to find that out before the
        first claim.
        """
        fields = {
            "name": self.config.name,
            "kind": WorkerKind.LOCAL,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(self.config.queues),
            "concurrency": self.config.concurrency,
        }

        def register() -> None:
            self._clock_ok = check_skew(f"worker:{self.id}")
            # The database's time, as every later heartbeat writes it (jobs.clock).
            Worker.objects.bulk_create(
                [Worker(pk=self.id, last_heartbeat=db_now(), **fields)],
                update_conflicts=True,
                unique_fields=["id"],
                update_fields=[*fields, "last_heartbeat"],
            )

        with_db_retry(
            register,
            what="register",
            attempts=1,
            sleep=self.guard.stopping.wait,
            give_up=self.guard.stopping.is_set,
        )

    def _beat(self) -> None:
        with self._lock:
            flights = list(self._flights.values())
        jobs = [(f.job.id, f.job.lease_token) for f in flights if isinstance(f, InFlight)]
        messages = [f.message.id for f in flights if isinstance(f, MessageFlight)]
        lost = extend_leases(worker_id=self.id, held=jobs, lease_seconds=self.config.lease_seconds)
        extend_visibility(messages, self.config.batch_visibility_seconds)
        if not self.guard.stopping.is_set() and not Worker.objects.filter(pk=self.id).exists():
            self._register()  # swept while unreachable: come back under the same id
        for job_id in lost:
            with self._lock:
                flight = self._flights.get(job_id)
            if flight is not None and not flight.cancel.is_set():
                log.warning("job.lease_lost job_id=%s (cancelled or taken over)", job_id)
                flight.cancel.set()
        self._clock_ok = check_skew(f"worker:{self.id}")

    def _may_claim(self) -> bool:
        """Claim this round: the host's clock is within bounds, no ``NotNow`` holds, and
        ``pre_dequeue`` agrees."""
        if not self._clock_ok or self._hold.active():
            return False
        answer = self.pre_dequeue()
        if isinstance(answer, NotNow):
            self._hold.start(answer)
            return False
        self._hold.end()  # a hold that ran out is over, whatever this round's answer
        return bool(answer)

    # --- claiming --------------------------------------------------------------
    def _free_slots(self) -> int:
        with self._lock:
            return self.config.concurrency - len(self._flights)

    def _idle(self) -> bool:
        with self._lock:
            return not self._flights and not self._completions

    def _settings(self) -> dict[str, QueueSettings]:
        """The settings of each served queue, re-read at most once a ``queue_settings_ttl``."""
        now = time.monotonic()
        if now - self._queue_settings_read > self.config.queue_settings_ttl:
            self._queue_settings = queue_settings(self.config.queues)
            self._queue_settings_read = now
        return self._queue_settings

    def _gather(self) -> None:
        """Wait until every running job finished, or ``GATHER_SECONDS`` after one did.

        Without it the loop wakes on the first finished job and writes and claims
        one or two at a time: two commits for very little work.
        """
        deadline = 0.0
        while True:
            with self._lock:
                finished = len(self._completions)
                running = len(self._flights) - finished
            if not finished or not running:
                return
            now = time.monotonic()
            if not deadline:
                deadline = now + GATHER_SECONDS
            elif now >= deadline:
                return
            self.wake.wait(deadline - now)
            self.wake.clear()

    def _cycle(self) -> int:
        """Write the gathered completions and claim; one statement when the queues allow it."""
        if self._fused:
            settings = self._settings()
            open_queues = [q for q in self.config.queues if not settings[q].paused]
            if open_queues and all(settings[q].plain_jobs for q in open_queues):
                return self._complete_and_claim(open_queues)
            if open_queues and all(settings[q].unlimited_jobs for q in open_queues):
                keyed = [q for q in open_queues if settings[q].keyed]
                return self._complete_and_claim(open_queues, keyed)
        self._flush_completions()
        return self._claim_pass()

    def _complete_and_claim(self, queues: list[str], keyed: Sequence[str] = ()) -> int:
        """Write the gathered completions and claim, with one commit per cycle.

        One statement (``complete_and_claim``); ``keyed`` queues' claims
        (``jobs.keyed_claims.keyed_pick``) take what the plain claim left, in the
        same statement (bench/flow_keys.py). Successes of jobs others wait for
        go first, in a transaction of their own that also claims what they
        release (``_complete_followed``): a chain's next step starts before
        this cycle's statement runs.
        """
        with self._lock:
            batch, self._completions = self._completions, []
            free = self.config.concurrency - len(self._flights) + len(batch)
            followed = [c for c in batch if _is_followed(self._flights.get(c.job_id))]
        limit = free if free > 0 and self._may_claim() else 0
        handed: list[ClaimedJob] = []
        if followed:
            plain = [c for c in batch if not _is_followed(self._flights.get(c.job_id))]
            done, written, handed = self._complete_followed(followed, followed, [], queues, limit)
            self._finish(done, written)
            batch, limit = plain, max(0, limit - len(handed))
        retry: list[float] = []

        def cycle() -> tuple[list[uuid.UUID], list[ClaimedJob]]:
            retry.clear()
            picks = [
                keyed_pick(q, limit=limit, local_operations=self._local_operations) for q in keyed
            ]
            moved, jobs = complete_and_claim(
                batch,
                queues=queues,
                worker_id=self.id,
                limit=limit,
                lease_seconds=self.config.lease_seconds,
                local_operations=self._local_operations,
                after=picks,
            )
            retry.extend(r for r in map(settled, picks) if r is not None)
            return moved, jobs

        try:
            moved, jobs = with_db_retry(cycle, what="complete_and_claim", attempts=3)
        except Exception as error:
            if not batch or is_transient(error):
                with self._lock:
                    self._completions[:0] = batch  # keep them; the leases are still ours
                raise
            # A value the per-job checks let through broke the batched statement:
            # write the batch one by one, failing only the job that holds it.
            self._complete_one_by_one(batch, error)
            return self._claim_pass()
        if retry:
            self._key_token_due = min(self._key_token_due, time.monotonic() + min(retry))
        self._submit_jobs(jobs)
        jobs += handed
        left = left_out(batch, moved)
        if left:  # others came to wait for these after they were claimed
            room = max(0, limit - len(jobs))
            batch, moved, more = self._complete_followed(batch, left, moved, queues, room)
            jobs += more
        self._finish(batch, moved)
        if not jobs:
            self._queue_settings_read = 0.0  # as in _claim_pass: a queue may have become keyed
        return len(jobs)

    def _claim_pass(self) -> int:
        free = self._free_slots()
        if free <= 0 or not self._may_claim():
            return 0
        settings = self._settings()
        open_queues = [q for q in self.config.queues if not settings[q].paused]
        job_queues = [q for q in open_queues if settings[q].kind == QueueKind.JOB]
        uncapped = [q for q in job_queues if settings[q].unlimited_jobs]
        claimed = 0
        if uncapped:
            claimed += self._start_jobs(uncapped, free, None)
        for queue in job_queues:
            cap, rate = settings[queue].cap, settings[queue].rate
            if rate is not None and free - claimed > 0:
                claimed += self._start_rate_limited(queue, free - claimed, cap, rate)
            elif cap is not None and free - claimed > 0:
                claimed += self._start_jobs([queue], free - claimed, cap)
        for queue in job_queues:
            if settings[queue].keyed and free - claimed > 0:
                claimed += self._start_keyed(queue, free - claimed, settings[queue])
        for queue in open_queues:
            if settings[queue].kind == QueueKind.BATCH and free - claimed > 0:
                messages = claim_messages(
                    queue=queue,
                    limit=free - claimed,
                    visibility_seconds=self.config.batch_visibility_seconds,
                )
                for message in messages:
                    self._submit(message.id, MessageFlight(message))
                claimed += len(messages)
        if not claimed:
            # Found nothing: read the settings afresh next time. A wake-up for a queue
            # whose first keyed job just made it keyed must not meet settings cached
            # from before (and sleep a poll with that job waiting).
            self._queue_settings_read = 0.0
        return claimed

    def _start_jobs(self, queues: list[str], limit: int, cap: int | None) -> int:
        jobs = claim_jobs(
            queues=queues,
            worker_id=self.id,
            limit=limit,
            lease_seconds=self.config.lease_seconds,
            cap=cap,
            local_operations=self._local_operations,
        )
        self._submit_jobs(jobs)
        return len(jobs)

    def _start_rate_limited(self, queue: str, limit: int, cap: int | None, rate: float) -> int:
        """Claim what the queue's bucket allows; an empty bucket is not asked again before
        its next token is due (``jobs.rate_limits``), whatever wakes the loop meanwhile."""
        if not self._token_waits.ready(queue, rate=rate):
            return 0
        claim = claim_rate_limited(
            queue=queue,
            worker_id=self.id,
            limit=limit,
            lease_seconds=self.config.lease_seconds,
            local_operations=self._local_operations,
            cap=cap,
        )
        if claim.retry_in is not None:
            self._token_waits.hold(queue, rate=rate, seconds=claim.retry_in)
        self._submit_jobs(claim.jobs)
        return len(claim.jobs)

    def _start_keyed(self, queue: str, limit: int, settings: QueueSettings) -> int:
        """Claim the queue's keyed jobs (``jobs.keyed_claims``), through its bucket if it has one.

        A key out of tokens held a job back: the loop wakes when its next token is due.
        """
        retry: list[float] = []

        def claim(n: int) -> list[ClaimedJob]:
            result = claim_keyed(
                queue=queue,
                worker_id=self.id,
                limit=n,
                lease_seconds=self.config.lease_seconds,
                local_operations=self._local_operations,
                cap=settings.cap,
            )
            if result.retry_in is not None:
                retry.append(result.retry_in)
            return result.jobs

        if settings.rate is None:
            jobs = claim(limit)
        elif not self._token_waits.ready(queue, rate=settings.rate):
            return 0
        else:
            bucket = claim_rate_limited(
                queue=queue,
                worker_id=self.id,
                limit=limit,
                lease_seconds=self.config.lease_seconds,
                claimer=claim,
            )
            if bucket.retry_in is not None:
                self._token_waits.hold(queue, rate=settings.rate, seconds=bucket.retry_in)
            jobs = bucket.jobs
        if retry:
            self._key_token_due = min(self._key_token_due, time.monotonic() + min(retry))
        self._submit_jobs(jobs)
        return len(jobs)

    def _until_next_token(self) -> float:
        """Seconds until a rate-limited queue's or key's next token is due (or a poll)."""
        due = self._token_waits.seconds_left(self.config.queues)
        wait = self.config.poll_seconds if due is None else due
        if self._key_token_due < math.inf:
            wait = min(wait, max(0.0, self._key_token_due - time.monotonic()))
            if wait == 0.0:
                self._key_token_due = math.inf
        return wait

    def _submit_jobs(self, jobs: list[ClaimedJob]) -> None:
        claimed = state_line_level(logging.DEBUG)  # INFO with JSON logs (LOG_FORMAT=json)
        debug = log.isEnabledFor(claimed)
        for job in jobs:
            if debug:
                log.log(
                    claimed,
                    "job.claimed job_id=%s operation=%s queue=%s attempt=%d",
                    job.id,
                    job.operation,
                    job.queue,
                    job.attempt,
                )
            flight = InFlight(job)
            if flight.deadline is not None:
                self._next_deadline = min(self._next_deadline, flight.deadline)
            self._submit(job.id, flight)

    def _submit(self, key: object, flight: Flight) -> None:
        with self._lock:
            self._flights[key] = flight
        self._pool.submit(key, flight)

    # --- per-job timeouts (workers.timeouts) -------------------------------------
    def _until_next_deadline(self) -> float:
        return max(self._next_deadline - time.monotonic(), 0.0)

    def _enforce_timeouts(self) -> None:
        """Fail the runs past their deadline (``JobTimeout``), stop them, free their slots.

        Main thread only; costs a comparison until the nearest deadline is due.
        """
        now = time.monotonic()
        if now < self._next_deadline:
            return
        with self._lock:
            watched = [
                f
                for f in self._flights.values()
                if isinstance(f, InFlight) and f.deadline is not None and not f.timed_out
            ]
        self._next_deadline = 0.0  # until this pass is through: an error retries it
        for flight in watched:
            if flight.deadline is not None and flight.deadline <= now and not flight.done:
                time_out_flight(flight)
                self._abandon(flight)
        self._next_deadline = min(
            (f.deadline for f in watched if f.deadline and not (f.timed_out or f.done)),
            default=math.inf,
        )

    def _enforce_timeouts_safely(self) -> None:
        try:
            self._enforce_timeouts()
        except Exception as error:  # noqa: BLE001 - during shutdown, keep draining
            log.warning("worker.timeouts_failed error=%s", error)
            reset_connection()

    def _abandon(self, flight: InFlight) -> None:
        """Give the timed-out run's slot to new work and its place in the pool to a new thread.

        Not if the run has returned meanwhile (its outcome is being written,
        fenced), nor past ``concurrency`` abandoned runs: then it keeps its slot.
        """
        key = flight.job.id
        with self._lock:
            if flight.done or self._flights.get(key) is not flight:
                return
            if len(self._abandoned) >= self.config.concurrency:
                log.warning(
                    "job.timeout_slot_kept job_id=%s (already %d abandoned runs; "
                    "the slot is freed when this run returns)",
                    key,
                    len(self._abandoned),
                )
                return
            flight.abandoned = time.monotonic()
            del self._flights[key]
            self._abandoned[key] = flight
        self._pool.add_thread()
        self._report_abandoned()

    def _report_abandoned(self) -> None:
        with self._lock:
            since = min((f.abandoned for f in self._abandoned.values()), default=0.0)
        report_abandoned(since)

    # --- execution and completion ------------------------------------------------
    def _execute(self, key: object, flight: Flight) -> None:
        try:
            if isinstance(flight, InFlight):
                flight.thread_id = threading.get_ident()
                try:
                    outcome = self._runner.run(flight)
                except BaseException:
                    # Never left holding a slot: the lease runs out, the reaper rescues the job.
                    with self._lock:
                        flight.done = True
                        self._flights.pop(key, None)
                        self._abandoned.pop(key, None)
                    raise
                with self._lock:
                    flight.done = True
                    if flight.abandoned:  # timed out: its slot went on long ago
                        self._abandoned.pop(key, None)
                    elif outcome.completion is not None:
                        self._completions.append(outcome.completion)
                    else:
                        self._flights.pop(key, None)
                if flight.abandoned:
                    self._report_abandoned()
                return
            run_message(flight)
            with self._lock:
                self._flights.pop(key, None)
        finally:
            self.wake.set()

    def _complete_followed(
        self,
        batch: list[Completion],
        left: list[Completion],
        moved: list,
        queues: Sequence[str],
        room: int,
    ) -> tuple[list[Completion], list, list[ClaimedJob]]:
        """Write the successes a cycle's one statement left out (jobs whose end releases
        others: ``complete_followed``), claiming up to ``room`` of the jobs they release in
        the same transaction (a chain's next step stays here, with no NOTIFY round trip).
        Kept for the next cycle when the database is away (the leases are still ours).
        Returns the batch to finish, what moved and the jobs claimed (already submitted)."""
        handoff = (
            Handoff(
                queues=queues,
                worker_id=self.id,
                limit=room,
                lease_seconds=self.config.lease_seconds,
                local_operations=self._local_operations,
            )
            if room > 0
            else None
        )
        claimed: list[ClaimedJob] = []
        try:
            written, claimed = with_db_retry(
                lambda: complete_followed(left, handoff=handoff),
                what="complete_followed",
                attempts=3,
            )
            moved = moved + written
        except Exception as error:
            if not is_transient(error):
                raise
            with self._lock:
                self._completions[:0] = left
            kept = {c.job_id for c in left}
            batch = [c for c in batch if c.job_id not in kept]
        self._submit_jobs(claimed)
        return batch, moved, claimed

    def _flush_completions(self) -> None:
        """Write every pending success in one transaction (each still fenced by its token)."""
        with self._lock:
            batch, self._completions = self._completions, []
        if not batch:
            return
        try:
            moved = with_db_retry(lambda: complete_jobs(batch), what="complete", attempts=3)
        except Exception as error:
            if is_transient(error):
                with self._lock:
                    self._completions[:0] = batch  # keep them; the leases are still ours
                raise
            self._complete_one_by_one(batch, error)
            return
        self._finish(batch, moved)

    def _complete_one_by_one(self, batch: list[Completion], error: Exception) -> None:
        """Write each completion of a batch that failed as a whole on its own.

        A completion the database refuses for its values (``_VALUE_ERRORS``)
        fails its job (``ResultNotStorable``, the database's reason in the
        message); the others succeed. Any other error keeps the unwritten
        completions for the next cycle and is raised.
        """
        log.warning(
            "worker.batch_write_failed jobs=%d error=%s (writing them one by one)",
            len(batch),
            f"{type(error).__name__}: {error}",
        )
        moved: list = []
        refused: list = []
        for index, completion in enumerate(batch):
            try:
                moved += with_db_retry(
                    functools.partial(complete_jobs, [completion]), what="complete", attempts=3
                )
            except _VALUE_ERRORS as refusal:
                self._fail_unstorable(completion, refusal)
                moved.append(completion.job_id)
                refused.append(completion.job_id)
            except Exception:
                with self._lock:
                    self._completions[:0] = batch[index:]
                self._finish(batch[:index], moved, tuple(refused))
                raise
        self._finish(batch, moved, tuple(refused))

    def _fail_unstorable(self, completion: Completion, error: Exception) -> None:
        """Fail a job whose success the database refused; its worker goes on."""
        reason = f"{type(error).__name__}: {error}".strip()
        try:
            with_db_retry(
                functools.partial(
                    transitions.fail_job,
                    completion.job_id,
                    lease_token=completion.lease_token,
                    error_code="ResultNotStorable",
                    error_message=(
                        "The database refused to store this job's result or progress: " + reason
                    ),
                ),
                what="fail",
                attempts=3,
            )
            log.warning(
                "job.failed job_id=%s error=ResultNotStorable message=%r",
                completion.job_id,
                reason[:500],
            )
        except LeaseLost:
            pass
        except Exception:  # noqa: BLE001 - the lease runs out; the reaper takes over
            log.exception("job.fail_unstorable_failed job_id=%s", completion.job_id)

    def _finish(self, batch: list[Completion], moved: list, refused: tuple = ()) -> None:
        """Free the slots of a written batch; send ``job_succeeded`` for the jobs that moved
        (``refused``: failed instead, their signal sent by ``fail_job``); warn about the
        jobs whose lease was gone."""
        if not batch:
            return
        heard = self._success_hooks or bool(signals.job_succeeded.receivers)
        with self._lock:
            flights = [self._flights.pop(c.job_id, None) for c in batch]
        if heard and moved:
            self._signal_successes(batch, flights, set(moved) - set(refused))
        if len(moved) == len(batch):
            return
        kept = set(moved)
        for completion in batch:
            if completion.job_id not in kept:
                log.warning(
                    "job.lease_lost job_id=%s (finished after cancel or takeover)",
                    completion.job_id,
                )

    def _signal_successes(
        self, batch: list[Completion], flights: list[Flight | None], succeeded: set
    ) -> None:
        """``job_succeeded`` for each written success: from the run's own facts, no query."""
        outcomes = [
            signals.success_outcome(f.job, c)
            for c, f in zip(batch, flights, strict=True)
            if c.job_id in succeeded and isinstance(f, InFlight)
        ]
        signals.dispatch(signals.job_succeeded, outcomes, registry=self._registry)

    def _flush_completions_safely(self) -> None:
        try:
            self._flush_completions()
        except Exception as error:  # noqa: BLE001 - during shutdown, keep draining
            log.warning("worker.flush_failed error=%s", error)
            reset_connection()
