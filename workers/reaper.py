"""The reaper: rescues what workers left behind, and keeps the tables from growing forever.

Each pass (``run_once``) handles, in order: workers whose heartbeat went
silent (their jobs are treated as expired leases, the rows removed), expired
leases (requeued up to ``MAX_LEASE_REQUEUES``, then failed), jobs past the
hard timeout that also stopped writing events, and retention. Every rescue
is a guarded UPDATE, so several reapers can run at once (one per machine)
without acting twice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from jobs.dialect import dialect
from jobs.models import Worker
from jobs.rescues import fail_timed_out, requeue_expired_leases
from workers.config import ReaperConfig
from workers.resilience import backoff_delay, is_transient, reset_connection

log = logging.getLogger("workers")


@dataclass
class ReaperResult:
    workers_swept: int = 0
    lease_requeued: int = 0
    lease_failed: int = 0
    timed_out: int = 0
    operations_hidden: int = 0
    jobs_deleted: int = 0
    messages_purged: int = 0

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


class Reaper:
    def __init__(self, config: ReaperConfig | None = None) -> None:
        self.config = config or ReaperConfig()
        self.stopping = threading.Event()

    def run_once(self) -> ReaperResult:
        result = ReaperResult()
        c = self.config
        now = timezone.now()
        cutoff = now - timedelta(seconds=c.worker_timeout_seconds)
        stale = list(Worker.objects.filter(last_heartbeat__lt=cutoff).values_list("pk", flat=True))
        while True:
            requeued, failed = requeue_expired_leases(
                max_requeues=c.max_lease_requeues, worker_ids=stale, limit=c.batch_size
            )
            result.lease_requeued += len(requeued)
            result.lease_failed += len(failed)
            if len(requeued) < c.batch_size and len(failed) < c.batch_size:
                break
        if stale:
            # Only rows still silent now: a worker that came back keeps its row.
            result.workers_swept, _ = Worker.objects.filter(
                pk__in=stale, last_heartbeat__lt=cutoff
            ).delete()
        result.operations_hidden = _hide_orphan_operations()
        result.timed_out = len(
            fail_timed_out(
                timeout_seconds=c.timeout_seconds, stall_seconds=c.stall_seconds, limit=c.batch_size
            )
        )
        result.jobs_deleted, result.messages_purged = self._retention(now)
        return result

    def _retention(self, now) -> tuple[int, int]:
        """Delete finished jobs (leaves first) and their events in bounded batches."""
        d = dialect()
        cutoff = d.ts(now - timedelta(days=self.config.retention_days))
        size = int(self.config.retention_batch_size)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT j.id FROM jobs_job j WHERE j.status IN ('succeeded', 'failed', 'cancelled') "
                "AND j.finished_at < %s AND NOT EXISTS "
                "(SELECT 1 FROM jobs_job c WHERE c.parent_id = j.id) LIMIT %s",
                [cutoff, size],
            )
            ids = [r[0] for r in cursor.fetchall()]
            if ids:
                marks = d.in_list(len(ids))
                for table in ("jobs_jobevent", "jobs_batchreceipt", "jobs_batchmessage"):
                    column = "job_id" if table == "jobs_jobevent" else "parent_id"
                    cursor.execute(f"DELETE FROM {table} WHERE {column} IN {marks}", ids)
                cursor.execute(f"DELETE FROM jobs_job WHERE id IN {marks}", ids)
            cursor.execute(
                "DELETE FROM jobs_batchmessage WHERE id IN (SELECT m.id FROM jobs_batchmessage m "
                "JOIN jobs_job p ON p.id = m.parent_id "
                "WHERE p.status IN ('succeeded', 'failed', 'cancelled') LIMIT %s)",
                [size],
            )
            purged = cursor.rowcount
        return len(ids), max(purged, 0)

    def run(self) -> None:
        failures = 0
        log.info("reaper.started interval=%.2fs", self.config.interval_seconds)
        while not self.stopping.is_set():
            try:
                result = self.run_once()
                failures = 0
                log.info("reaper.pass %s", result)
                delay = self.config.interval_seconds
            except Exception as error:
                if not is_transient(error):
                    raise
                delay = backoff_delay(failures)
                failures += 1
                log.warning("reaper.db_unavailable delay=%.2fs error=%s", delay, error)
                reset_connection()
            self.stopping.wait(delay)
        log.info("reaper.stopped")


def _hide_orphan_operations() -> int:
    """Soft-delete remote operations nobody provides any more (see jobs.remote)."""
    try:
        from jobs.remote import soft_delete_orphan_operations
    except ImportError:
        return 0
    return soft_delete_orphan_operations()
