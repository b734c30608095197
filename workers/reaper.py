"""The reaper: rescues what workers left behind, and keeps the tables from growing forever.

Between passes, every ``WORKER_LIVENESS_SECONDS``, it looks for local workers
whose PostgreSQL session ended (``workers.liveness``: a ``kill -9``, a lost
machine) and rescues their jobs at once rather than at lease expiry.

Each pass (``run_once``) handles, in order: workers whose heartbeat went
silent (their jobs are treated as expired leases, the rows removed), expired
leases (requeued up to ``MAX_LEASE_REQUEUES``, then failed), jobs past the
hard timeout that also stopped writing events, jobs past their own
``timeout_seconds`` by ``TIMEOUT_GRACE_SECONDS`` (``jobs.timeouts``), retention, and the purge of
batch messages left by finished parents. Periodic schedules
(``jobs.schedules``) fire first in each pass and, between passes, as each
falls due, for at most ``SCHEDULE_FIRE_BUDGET_SECONDS`` at a time (the most
overdue first; the rest stay due for the next wake-up), so however many are
due the other steps run every pass; the code's schedules are synced at the
first pass. Every rescue is a guarded UPDATE and every deletion repeats its
conditions, so several reapers can run at once (one per machine) without
acting twice. Deferred parents hold no lease:
only the timeout (with its stall grace) applies to them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db import connection, transaction

from jobs.aging import age_priorities
from jobs.clock import check_skew, db_now
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.key_limits import apply_declared_limits
from jobs.key_state import prune_idle_keys
from jobs.metrics.rollup import prune_metric_rollups, roll_up_metrics
from jobs.models import ScheduleFire, Worker
from jobs.partitions import (
    covered_ranges,
    ensure_partitions,
    event_partitions,
    is_partitioned,
    period,
    retire_partitions,
)
from jobs.queue_limits import apply_configured_queues
from jobs.rescues import fail_timed_out, requeue_expired_leases
from jobs.retention import current_retention
from jobs.schedules.declared import sync_code_schedules
from jobs.schedules.firing import FireTimer, fire_due_schedules, prune_fires
from jobs.tables import BATCH_MESSAGE_TABLE, BATCH_RECEIPT_TABLE, EVENT_TABLE, JOB_TABLE
from jobs.timeouts import fail_overdue_jobs
from jobs.workflows import prune_finished_workflows
from workers.config import ReaperConfig
from workers.liveness import LivenessWatch, forget_lost_workers, workers_without_liveness
from workers.resilience import backoff_delay, is_transient, reset_connection, with_db_retry

log = logging.getLogger("workers")


# Bounds of one pass: each step handles at most this many batches, so a
# huge backlog is worked off over several passes and every step gets its turn.
ROUNDS_PER_PASS = 10
TERMINAL = "('succeeded', 'failed', 'cancelled')"
TERMINAL_STATUSES = ("succeeded", "failed", "cancelled")


@dataclass
class ReaperResult:
    workers_lost: int = 0
    workers_swept: int = 0
    lease_requeued: int = 0
    lease_failed: int = 0
    timed_out: int = 0
    operations_hidden: int = 0
    jobs_deleted: int = 0
    messages_purged: int = 0
    schedules_fired: int = 0
    schedules_left: int = 0  # due schedules the firing budget left for the next wake-up
    fires_pruned: int = 0
    workflows_pruned: int = 0
    metric_events: int = 0
    metric_rows_pruned: int = 0
    partitions_created: int = 0
    partitions_dropped: int = 0
    priorities_aged: int = 0
    keys_pruned: int = 0  # idle flow keys' rows (jobs.key_state)
    errors: int = 0

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


class Reaper:
    def __init__(self, config: ReaperConfig | None = None) -> None:
        self.config = config or ReaperConfig()
        self.stopping = threading.Event()
        self.liveness = LivenessWatch(self.config.worker_lost_seconds)
        self.schedules = FireTimer()
        self._schedules_synced = False

    def rescue_lost_workers(self) -> ReaperResult:
        """Rescue the jobs of local workers whose liveness lock has been free for the grace.

        Their jobs follow the expired-lease rules (``job.lease_expired_requeue``
        within the budget, else failed); their rows go. A worker whose lock is
        taken again before the grace is up keeps everything.
        """
        result = ReaperResult()
        lost = self.liveness.lost(workers_without_liveness())
        if not lost:
            return result
        c = self.config
        for _ in range(ROUNDS_PER_PASS):
            requeued, failed = requeue_expired_leases(
                max_requeues=c.max_lease_requeues, worker_ids=lost, limit=c.batch_size
            )
            result.lease_requeued += len(requeued)
            result.lease_failed += len(failed)
            if len(requeued) < c.batch_size and len(failed) < c.batch_size:
                break
        else:
            return result  # more to do: the next check goes on with the same workers
        result.workers_lost = forget_lost_workers(lost)
        self.liveness.forget(lost)
        log.warning(
            "reaper.workers_lost workers=%s requeued=%d failed=%d",
            ",".join(str(w) for w in lost),
            result.lease_requeued,
            result.lease_failed,
        )
        return result

    def run_once(self) -> ReaperResult:
        """One pass over every step.

        A non-transient error in one step (a bug, a constraint hit by a
        concurrent insert) is logged and counted in ``errors`` and the other
        steps still run; a transient one (database gone) ends the pass and
        the caller backs off.
        """
        result = ReaperResult()
        # The database's clock (jobs.clock): schedules, sweeps and retention by
        # it, whatever this host's clock says; the look at it checks the skew too.
        check_skew("reaper")
        now = db_now()
        steps = (
            ("schedules", self._schedules),
            ("leases", self._leases),
            ("orphan_operations", self._orphan_operations),
            ("timeouts", self._timeouts),
            ("partitions", self._partitions),
            ("retention", self._retention),
            ("purge", self._purge),
            ("metrics", self._metrics),
            ("aging", self._aging),
        )
        for name, step in steps:
            try:
                step(now, result)
            except Exception as error:
                if is_transient(error):
                    raise
                result.errors += 1
                log.exception("reaper.step_failed step=%s error=%s", name, error)
        return result

    def _leases(self, now: datetime, result: ReaperResult) -> None:
        c = self.config
        cutoff = now - timedelta(seconds=c.worker_timeout_seconds)
        stale = list(Worker.objects.filter(last_heartbeat__lt=cutoff).values_list("pk", flat=True))
        for _ in range(ROUNDS_PER_PASS):
            requeued, failed = requeue_expired_leases(
                max_requeues=c.max_lease_requeues, worker_ids=stale, limit=c.batch_size
            )
            result.lease_requeued += len(requeued)
            result.lease_failed += len(failed)
            if len(requeued) < c.batch_size and len(failed) < c.batch_size:
                break
        else:
            return  # more to do: keep the stale workers' rows until their jobs are all rescued
        if stale:
            # Only rows still silent now: a worker that came back keeps its row.
            result.workers_swept, _ = Worker.objects.filter(
                pk__in=stale, last_heartbeat__lt=cutoff
            ).delete()

    def _schedules(self, now: datetime, result: ReaperResult) -> None:
        """Sync the code's schedules (first pass only), then fire what is due."""
        if not self._schedules_synced:
            self._schedules_synced = True  # once per start: a bug here must not stop the firing
            try:
                sync_code_schedules(now)
            except Exception as error:
                if is_transient(error):
                    self._schedules_synced = False
                    raise
                result.errors += 1
                log.exception("reaper.schedule_sync_failed error=%s", error)
        fired = fire_due_schedules(now)
        result.schedules_fired += fired.fired
        result.schedules_left = fired.left
        if fired.left:
            log_cut_short("pass", fired.left)

    def _orphan_operations(self, now: datetime, result: ReaperResult) -> None:
        result.operations_hidden = _hide_orphan_operations()

    def _timeouts(self, now: datetime, result: ReaperResult) -> None:
        c = self.config
        for _ in range(ROUNDS_PER_PASS):
            failed = fail_timed_out(
                timeout_seconds=c.timeout_seconds, stall_seconds=c.stall_seconds, limit=c.batch_size
            )
            result.timed_out += len(failed)
            if len(failed) < c.batch_size:
                break
        # Per-job timeouts whose worker did not act (jobs.timeouts).
        for _ in range(ROUNDS_PER_PASS):
            failed = fail_overdue_jobs(grace_seconds=c.timeout_grace_seconds, limit=c.batch_size)
            result.timed_out += len(failed)
            if len(failed) < c.batch_size:
                break

    def _partitions(self, now: datetime, result: ReaperResult) -> None:
        """PostgreSQL: make the event partitions ahead, drop those past the retention whole.

        The cutoff is the longest retention in force (``jobs.retention``): no
        finished job a shorter one still keeps can lose its events that way.
        """
        result.partitions_created += ensure_partitions(now)
        longest = current_retention(self.config.retention_days).longest
        result.partitions_dropped += retire_partitions(now - timedelta(days=longest)).dropped

    def _retention(self, now: datetime, result: ReaperResult) -> None:
        """Delete finished jobs past their retention (leaves first) with their rows, in batches.

        Each job by the retention of its queue and status (``jobs.retention``):
        one deletion per group of statuses sharing a retention, and one per
        queue with rules of its own.

        With partitioned events, a job of the longest retention that an
        attached partition covers waits for its partition to be dropped
        (``_partitions``), events and all, which happens one period after the
        cutoff passes the period's end; only jobs finished longer ago than
        that (a clock moved, rows edited) go here, so nothing is left behind.
        Jobs of a shorter retention go here, their events by DELETE: keeping
        them until their partition goes would keep them the longest retention.
        """
        result.keys_pruned = prune_idle_keys(now)
        size = int(self.config.retention_batch_size)
        rules = current_retention(self.config.retention_days)
        covered = covered_ranges(event_partitions()) if is_partitioned() else []
        for cut in rules.cuts(now):
            waits = covered if cut.longest else []
            late = cut.cutoff - period() if waits else None
            for _ in range(ROUNDS_PER_PASS):
                deleted = delete_finished_jobs(
                    cut.cutoff,
                    size,
                    covered=waits,
                    covered_cutoff=late,
                    statuses=cut.statuses,
                    queues=cut.queues,
                    excluded_queues=cut.excluded,
                )
                result.jobs_deleted += deleted
                if deleted < size:
                    break
        cutoff = now - timedelta(days=rules.default)
        for _ in range(ROUNDS_PER_PASS):
            pruned = prune_fires(cutoff, size)
            result.fires_pruned += pruned
            if pruned < size:
                break
        for _ in range(ROUNDS_PER_PASS):
            pruned = prune_finished_workflows(cutoff, size)
            result.workflows_pruned += pruned
            if pruned < size:
                break

    def _aging(self, now: datetime, result: ReaperResult) -> None:
        """Priority aging (``PRIORITY_AGING_SECONDS``; jobs.aging), when it is on."""
        every = float(knob("PRIORITY_AGING_SECONDS") or 0)
        if every > 0:
            result.priorities_aged = age_priorities(every_seconds=every, now=now)

    def _purge(self, now: datetime, result: ReaperResult) -> None:
        """Drop the leftover batch messages of parents that finished (timeout, failure)."""
        size = int(self.config.retention_batch_size)
        for _ in range(ROUNDS_PER_PASS):
            purged = purge_messages_of_finished_parents(size)
            result.messages_purged += purged
            if purged < size:
                break

    def _metrics(self, now: datetime, result: ReaperResult) -> None:
        """Roll the new events up into the metrics (``jobs.metrics.rollup``), prune old minutes."""
        result.metric_events += roll_up_metrics(now=now).events
        result.metric_rows_pruned += prune_metric_rollups(
            now=now, limit=int(self.config.retention_batch_size), rounds=ROUNDS_PER_PASS
        )

    def run(self) -> None:
        failures = 0
        log.info("reaper.started interval=%.2fs", self.config.interval_seconds)
        # CONTROLPLANE["QUEUES"], for deployments whose workers are all remote.
        with_db_retry(apply_configured_queues, what="queue_settings", attempts=3)
        with_db_retry(apply_declared_limits, what="key_settings", attempts=3)
        while not self.stopping.is_set():
            try:
                result = self.run_once()
                failures = 0
                log.info("reaper.pass %s", result)
                delay = self.config.interval_seconds
                self._watch_liveness_until(time.monotonic() + delay)
                continue
            except Exception as error:
                if is_transient(error):
                    delay = backoff_delay(failures)
                    failures += 1
                    log.warning("reaper.db_unavailable delay=%.2fs error=%s", delay, error)
                else:  # never let one bad pass end the reaper
                    delay = self.config.interval_seconds
                    log.exception("reaper.pass_failed error=%s", error)
                reset_connection()
                # Our own outage: what we saw of others' locks before it says nothing now.
                self.liveness.forget()
            self.stopping.wait(delay)
        log.info("reaper.stopped")

    def _watch_liveness_until(self, deadline: float) -> None:
        """Until the next pass: check workers' liveness every ``worker_liveness_seconds``,
        and fire schedules as they fall due (``FireTimer``: at the earliest
        ``next_fire_at``, and at least every ``SCHEDULE_POLL_SECONDS``), so an
        every-second schedule fires on time whatever the pass interval.

        The database going away ends the wait early: the pass that follows
        meets the same error and backs off.
        """
        step = self.config.worker_liveness_seconds
        next_check = time.monotonic() + step if step > 0 else math.inf
        while True:
            now = time.monotonic()
            remaining = deadline - now
            wait = min(remaining, next_check - now, self.schedules.seconds_until_due())
            if remaining <= 0 or self.stopping.wait(max(wait, 0.0)):
                return
            try:
                fired = self.schedules.fire_if_due()
                if fired is not None and (fired.fired or fired.skipped_overlap or fired.failed):
                    log.info("reaper.schedules %s", fired)
                if fired is not None and fired.left:
                    log_cut_short("timer", fired.left)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + step
                    self.rescue_lost_workers()
            except Exception as error:
                self.liveness.forget()
                reset_connection()
                if is_transient(error):
                    return
                log.exception("reaper.liveness_failed error=%s", error)


def log_cut_short(where: str, left: int) -> None:
    """The firing budget ran out with ``left`` schedules still due (they fire next)."""
    log.warning(
        "reaper.schedules_cut_short where=%s left=%d budget=%.2fs",
        where,
        left,
        float(knob("SCHEDULE_FIRE_BUDGET_SECONDS")),
    )


def delete_finished_jobs(
    cutoff: datetime,
    limit: int,
    *,
    covered: Sequence[tuple[uuid.UUID, uuid.UUID]] = (),
    covered_cutoff: datetime | None = None,
    statuses: Sequence[str] = TERMINAL_STATUSES,
    queues: Sequence[str] | None = None,
    excluded_queues: Sequence[str] = (),
) -> int:
    """Delete up to ``limit`` jobs finished before ``cutoff`` that have no children, and their rows.

    Only jobs in one of ``statuses``, of ``queues`` (None: any) and of no queue
    in ``excluded_queues``: the reaper's retention makes one call per group
    (``jobs.retention.Retention.cuts``).

    A job whose id lies in one of the ``covered`` ranges ``[low, high)`` (on
    PostgreSQL, the attached event partitions) goes only if it finished
    before ``covered_cutoff``: the others wait for their partition's drop.

    The DELETE repeats every condition of the pick, so a job an operator
    retried meanwhile, or one that got a child, stays. On PostgreSQL the pick
    locks its rows and skips locked ones (a retry or a child insert in
    flight), so two reapers never pick the same job. The events, receipts and
    messages of exactly the deleted jobs go in the same transaction (the
    events keep no foreign key to prove it: migration 0019). Returns the
    number of jobs deleted.
    """
    d = dialect()
    lock = " FOR UPDATE OF j SKIP LOCKED" if d.postgres else ""
    chosen = [s for s in statuses if s in TERMINAL_STATUSES]
    if not chosen or (queues is not None and not queues):
        return 0
    finished = f"status IN {d.in_list(len(chosen))} AND finished_at < %s"
    picked: list[object] = [*chosen]
    if queues is not None:
        finished += f" AND queue IN {d.in_list(len(queues))}"
    if excluded_queues:
        finished += f" AND queue NOT IN {d.in_list(len(excluded_queues))}"
    outside, bounds = "", []
    if covered:
        ranges = " AND ".join("NOT (id >= %s AND id < %s)" for _ in covered)
        outside = f" AND (finished_at < %s OR ({ranges}))"
        bounds = [d.ts(covered_cutoff or cutoff), *(d.uuid(v) for pair in covered for v in pair)]
    where = [*picked, d.ts(cutoff), *(queues or ()), *excluded_queues]
    leaf = f"NOT EXISTS (SELECT 1 FROM {JOB_TABLE} c WHERE c.parent_id = {{table}}.id)"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {JOB_TABLE} WHERE {finished}{outside} "
            f"AND {leaf.format(table=JOB_TABLE)} "
            f"AND id IN (SELECT j.id FROM {JOB_TABLE} j WHERE {finished}{outside} "
            f"AND {leaf.format(table='j')} LIMIT %s{lock}) RETURNING id",
            [*where, *bounds, *where, *bounds, int(limit)],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if ids:
            marks = d.in_list(len(ids))
            for table, column in (
                (EVENT_TABLE, "job_id"),
                (BATCH_RECEIPT_TABLE, "parent_id"),
                (BATCH_MESSAGE_TABLE, "parent_id"),
            ):
                cursor.execute(f"DELETE FROM {table} WHERE {column} IN {marks}", ids)
            # A schedule's fire history outlives the jobs it names (schedulefire_job_idx).
            fire = ScheduleFire._meta
            job_column = fire.get_field("job").column
            cursor.execute(
                f"UPDATE {fire.db_table} SET {job_column} = NULL WHERE {job_column} IN {marks}", ids
            )
    return len(ids)


def purge_messages_of_finished_parents(limit: int) -> int:
    """Delete up to ``limit`` batch messages whose parent has finished.

    Driven from the parents: first the finished parents that still have
    messages, then their messages, with the parent's status repeated in the
    DELETE so a parent an operator retried (and that dispatched again) keeps
    its new messages. Returns the number of messages deleted.
    """
    d = dialect()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT p.id FROM {JOB_TABLE} p WHERE p.status IN {TERMINAL} "
            f"AND p.id IN (SELECT m.parent_id FROM {BATCH_MESSAGE_TABLE} m) LIMIT %s",
            [int(limit)],
        )
        parents = [r[0] for r in cursor.fetchall()]
        if not parents:
            return 0
        cursor.execute(
            f"DELETE FROM {BATCH_MESSAGE_TABLE} WHERE id IN "
            f"(SELECT m.id FROM {BATCH_MESSAGE_TABLE} m "
            f"WHERE m.parent_id IN {d.in_list(len(parents))} "
            f"AND EXISTS (SELECT 1 FROM {JOB_TABLE} p "
            f"WHERE p.id = m.parent_id AND p.status IN {TERMINAL}) LIMIT %s)",
            [*parents, int(limit)],
        )
        return max(cursor.rowcount, 0)


def _hide_orphan_operations() -> int:
    """Soft-delete remote operations nobody provides any more (jobs.remote_operations)."""
    try:
        from jobs.remote_operations import soft_delete_orphan_operations
    except ImportError:
        return 0
    return soft_delete_orphan_operations()
