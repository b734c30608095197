"""The names of the events the engine writes on a job's timeline.

They are public contract (the CONTRACT's list of events): clients, the
dashboard and the metrics read them, so a value never changes. Operations
add their own names through ``emit``; these are the engine's. A module of
constants only, so every module can use them without importing another.
"""

from __future__ import annotations

JOB_ENQUEUED = "job.enqueued"  # implied by the job row (jobs.timeline)
JOB_STARTED = "job.started"  # queued -> running: a worker claimed it
JOB_SUCCEEDED = "job.succeeded"  # running -> succeeded
JOB_FAILED = "job.failed"  # running -> failed
JOB_CANCELLED = "job.cancelled"  # queued or running -> cancelled (an operator, or the parent)
JOB_RETRY_LATER = "job.retry_later"  # running -> queued: the operation asked, attempt not counted
JOB_RETRY_SCHEDULED = "job.retry_scheduled"  # running -> queued: a failure with attempts left
JOB_DEFERRED = "job.deferred"  # a coordinator stays running while its batches work
JOB_REQUEUED = "job.requeued"  # running -> queued now: shutdown, disconnect, an operator
JOB_LEASE_EXPIRED_REQUEUE = "job.lease_expired_requeue"  # a rescue under the lease budget
JOB_LEASE_EXPIRED = "job.lease_expired"  # a rescue past the lease budget: failed
JOB_OUTAGE_REQUEUE = "job.outage_requeue"  # a database outage cut the run short
JOB_TIMEOUT = "job.timeout"  # running -> failed past the job's timeout
JOB_RETRIED = "job.retried"  # failed or cancelled -> queued by an operator
JOB_RUN_NOW = "job.run_now"  # a waiting job brought forward (no status change)
JOB_PROGRESS = "job.progress"  # an operation's progress report (JobContext.progress)
JOB_LOG = "job.log"  # one record an operation logged or printed (jobs.job_logs)
JOB_LOG_TRUNCATED = "job.log_truncated"  # the job's log bounds were reached: what was dropped
BATCH_DISPATCHED = "batch.dispatched"  # a coordinator handed its batches out (jobs.batches)
BATCH_WRITTEN = "batch.written"  # one batch's output written to its parent (jobs.batches)

# The engine's own moves: names a remote worker may not write (it would forge a transition).
TRANSITION_EVENTS = frozenset(
    {
        JOB_ENQUEUED,
        JOB_STARTED,
        JOB_SUCCEEDED,
        JOB_FAILED,
        JOB_CANCELLED,
        JOB_RETRY_LATER,
        JOB_RETRY_SCHEDULED,
        JOB_DEFERRED,
        JOB_REQUEUED,
        JOB_LEASE_EXPIRED_REQUEUE,
        JOB_LEASE_EXPIRED,
        JOB_OUTAGE_REQUEUE,
        JOB_TIMEOUT,
        JOB_RETRIED,
    }
)

# A job's execution logs: written by capture or ``POST /jobs/<id>/logs``, within their bounds.
LOG_EVENTS = (JOB_LOG, JOB_LOG_TRUNCATED)

# Rescues of a job its worker no longer held: the reaper's and the timeouts'.
RECLAIM_EVENTS = (JOB_LEASE_EXPIRED_REQUEUE, JOB_LEASE_EXPIRED, JOB_TIMEOUT)
