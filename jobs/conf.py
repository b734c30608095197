"""The control plane's knobs, with named defaults.

Read order for every knob: ``CONTROLPLANE_<NAME>`` environment variable, then
``settings.CONTROLPLANE[NAME]``, then the default below. Values are read on
each access so tests can override settings.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Leases and liveness.
    "LEASE_SECONDS": 30.0,
    "HEARTBEAT_SECONDS": 10.0,
    "WORKER_TIMEOUT_SECONDS": 60.0,
    # Clocks (jobs.clock): coordination uses the database's clock; a worker or
    # reaper whose own clock is off by more than WARN logs it at start and on
    # each heartbeat, and a worker off by more than MAX stops claiming (0: never).
    "CLOCK_SKEW_WARN_SECONDS": 2.0,
    "CLOCK_SKEW_MAX_SECONDS": 600.0,
    # A local worker whose liveness lock (PostgreSQL) stays free this long is
    # gone: its jobs are rescued at once (workers.liveness). The reaper checks
    # every WORKER_LIVENESS_SECONDS; a worker's listener retries its lost
    # connection at least every LIVENESS_RECONNECT_SECONDS.
    "WORKER_LOST_SECONDS": 3.0,
    "WORKER_LIVENESS_SECONDS": 1.0,
    "LIVENESS_RECONNECT_SECONDS": 0.5,
    # Worker loop.
    "POLL_SECONDS": 2.0,
    "POLL_ONLY": False,
    # The class runworker (and each --processes child) runs: the dotted path of a
    # workers.engine.JobWorker subclass, whose pre_dequeue/pre_handle/post_handle
    # hooks are the host's (workers.config.worker_class).
    "WORKER_CLASS": "workers.engine.JobWorker",
    "SHUTDOWN_GRACE_SECONDS": 30.0,
    # After the grace (or a second signal): how long requeueing the jobs still
    # running and unregistering may take before the worker exits regardless.
    "SHUTDOWN_CLEANUP_SECONDS": 5.0,
    "RETRY_BACKOFF_SECONDS": 2.0,
    "RETRY_BACKOFF_MAX_SECONDS": 3600.0,
    # The rest of the default retry policy (jobs.retry_policy): each delay is cut by up
    # to RETRY_JITTER of itself; RETRY_STRATEGY is exponential, linear or constant. A job
    # may ask to run later (RetryLaterError) RETRY_LATER_MAX times, and, when
    # RETRY_LATER_MAX_SECONDS is above 0, until that long after it was enqueued.
    "RETRY_JITTER": 0.5,
    "RETRY_STRATEGY": "exponential",
    "RETRY_LATER_MAX": 100,
    "RETRY_LATER_MAX_SECONDS": 0.0,
    "DB_RETRY_INITIAL_SECONDS": 0.5,
    "DB_RETRY_MAX_SECONDS": 30.0,
    # Runs of one job cut short by a database outage that are requeued without
    # counting the attempt; the next such run fails it (DatabaseUnavailable).
    "MAX_OUTAGE_REQUEUES": 3,
    # Reaper.
    "REAPER_INTERVAL_SECONDS": 30.0,
    "REAPER_TIMEOUT_SECONDS": 6 * 3600.0,
    "REAPER_STALL_SECONDS": 1800.0,
    "MAX_LEASE_REQUEUES": 3,
    "RETENTION_DAYS": 7.0,
    # Retention by final status and by queue (jobs.retention), in days:
    # {"succeeded": 1, "failed": 30}; {"reports": {"succeeded": 0.5}} (a number: every
    # status). A queue's retention set on the dashboard's queues page wins over these.
    "RETENTION_DAYS_BY_STATUS": {},
    "QUEUE_RETENTION_DAYS": {},
    "RETENTION_BATCH_SIZE": 1000,
    # PostgreSQL: the events table is partitioned by job id, one partition per
    # EVENT_PARTITION_HOURS of job creation, made EVENT_PARTITIONS_AHEAD periods
    # ahead by the reaper and dropped whole by retention (jobs.partitions).
    "EVENT_PARTITION_HOURS": 24.0,
    "EVENT_PARTITIONS_AHEAD": 3,
    # Per-job timeouts (jobs.timeouts): the reaper fails a running job this long
    # past its deadline when its worker did not (dead, stuck, or remote and silent).
    "TIMEOUT_GRACE_SECONDS": 10.0,
    # runworker --processes: a child whose abandoned timed-out run still goes on
    # this long after the worker gave up on it is stopped and replaced.
    "TIMEOUT_KILL_GRACE_SECONDS": 30.0,
    # Remote-declared operations stay enqueueable this long after the last
    # worker declaring them left (a redeploy): their jobs wait queued for the
    # next worker. After it, enqueue answers "Unknown operation".
    "REMOTE_OPERATION_GRACE_SECONDS": 24 * 3600.0,
    # Remote workers may serve local and built-in operations (jobs.remote_operations).
    "REMOTE_MAY_SERVE_LOCAL": False,
    # Which operations and queues each remote account may serve (django_controlplane.remote.grants):
    # {"users": {name: {"operations": [globs], "queues": [globs]}}, "groups": {...}}.
    # None: no allow-list. Set: an account listed nowhere serves nothing.
    "REMOTE_WORKER_GRANTS": None,
    # Batch queues.
    "BATCH_VISIBILITY_SECONDS": 60.0,
    "BATCH_MAX_ATTEMPTS": 3,
    # Metrics (jobs.metrics): GET /metrics also takes ``Authorization: Bearer
    # <METRICS_TOKEN>`` when set; the reaper's per-minute rollups are kept
    # METRICS_RETENTION_DAYS; the rollup reads events at least METRICS_SETTLE_SECONDS
    # old (a transaction still open that long past its first event is missed).
    "METRICS_TOKEN": "",
    "METRICS_RETENTION_DAYS": 30.0,
    "METRICS_SETTLE_SECONDS": 10.0,
    # "json": one JSON line per job state change from the jobs/workers loggers
    # (jobs.logging_json); the demo settings also switch the formatter.
    "LOG_FORMAT": "plain",
    # PostgreSQL: enqueue's INSERT as a server-side prepared statement (jobs.prepared);
    # off by itself behind a transaction pooler or with OPTIONS prepare_threshold None.
    "PREPARED_STATEMENTS": True,
    # Limits.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # What a run may store (jobs.storable): a result's JSON longer than
    # MAX_RESULT_BYTES fails the job (ResultTooLarge; a remote complete gets a
    # 400), and so does a longer event message (EventMessageTooLong); longer
    # error messages are cut, with a visible marker.
    "MAX_RESULT_BYTES": 1024 * 1024,
    # What one job may read of its dependencies' results in all (jobs.dependencies).
    "MAX_DEPENDENCY_RESULTS_BYTES": 16 * 1024 * 1024,
    "MAX_ERROR_MESSAGE_CHARS": 10_000,
    "MAX_EVENT_MESSAGE_CHARS": 10_000,
    # Job logs (jobs.job_logs, workers.log_capture): what an operation logs (at
    # JOB_LOG_LEVEL or above) and prints while it runs goes on its timeline as
    # job.log events, flushed every JOB_LOG_FLUSH_SECONDS and when the run ends;
    # per job at most MAX_RECORDS records and MAX_BYTES bytes, each message cut at
    # MAX_MESSAGE_CHARS; past that one job.log_truncated event counts the rest.
    # JOB_LOG_ECHO False: captured records and prints stay off the worker's output.
    "JOB_LOG_CAPTURE": True,
    "JOB_LOG_LEVEL": "INFO",
    "JOB_LOG_ECHO": True,
    "JOB_LOG_MAX_RECORDS": 10_000,
    "JOB_LOG_MAX_BYTES": 1_000_000,
    "JOB_LOG_MAX_MESSAGE_CHARS": 2_000,
    "JOB_LOG_FLUSH_SECONDS": 1.0,
    "DASHBOARD_STATEMENT_TIMEOUT_MS": 5000,
    "COUNT_CAP": 10_000,
    # Read replica (jobs.replica, DATABASE_REPLICA_URL): dashboard pages, API lists and
    # /metrics read the primary instead while the replica lags more than MAX_LAG (measured
    # at most every CHECK seconds per process), and for STICKY seconds after the same
    # client wrote (a cookie), so the page after an operator action shows it.
    "REPLICA_MAX_LAG_SECONDS": 5.0,
    "REPLICA_CHECK_SECONDS": 1.0,
    "REPLICA_STICKY_SECONDS": 5.0,
    # manage.py serve (django_controlplane.web.processes): a connection whose request head has not
    # all arrived this long after it opened (or after the head's first byte) is
    # closed; an idle keep-alive connection after KEEP_ALIVE; a WebSocket message
    # larger than MAX_WEBSOCKET_MESSAGE_BYTES closes its socket (1009).
    "HTTP_HEADER_TIMEOUT_SECONDS": 10.0,
    "HTTP_KEEP_ALIVE_SECONDS": 5.0,
    "MAX_WEBSOCKET_MESSAGE_BYTES": 64 * 1024,
    # Web processes: how long a token (with its user and permissions) is remembered.
    "TOKEN_CACHE_SECONDS": 10.0,
    # Web processes: how long queue settings (paused, caps) are remembered for remote claims.
    "QUEUE_SETTINGS_CACHE_SECONDS": 1.0,
    # Periodic schedules (jobs.schedules), fired by the reaper. SCHEDULES: declared
    # in settings, [{"name": ..., "operation": ..., "cron" | "every_seconds": ...}].
    # A slot seen more than the grace late is missed (catch_up "none" skips it);
    # catch_up "all" fires at most CATCH_UP_MAX missed slots; a reaper looks for
    # new or resumed schedules at least every POLL seconds between passes.
    "SCHEDULES": [],
    "SCHEDULE_MISFIRE_GRACE_SECONDS": 60.0,
    "SCHEDULE_CATCH_UP_MAX": 100,
    "SCHEDULE_POLL_SECONDS": 1.0,
    # A reaper fires schedules for at most this long per pass and per wake-up
    # between passes (most overdue first; the rest stay due for the next one),
    # so a crowd of due schedules cannot crowd out its other duties. 0: no limit.
    "SCHEDULE_FIRE_BUDGET_SECONDS": 2.0,
    # Per-queue limits applied by workers and reapers at start when they change
    # (jobs.queue_limits): {"emails": {"rate_limit_per_second": 5, "concurrency_cap": 10}}.
    "QUEUES": {},
    # Flow key limits by family (jobs.key_limits), applied like QUEUES:
    # {"account": {"concurrency": 2}, "api": {"rate": 10, "burst": 20}}.
    "KEYS": {},
    # Priority aging (jobs.aging): each time a ready job has waited this many more
    # seconds, the reaper raises its priority by one (up to the highest), so low
    # priority work is never starved for ever. 0: off.
    "PRIORITY_AGING_SECONDS": 0.0,
    # Where operations live: modules imported at start-up. Every installed
    # app's ``operations`` module is imported as well.
    # (``jobs.tasks_operation``: the operation of the django.tasks backend, without it.)
    "OPERATION_MODULES": ["jobs.diagnostics", "jobs.tasks_operation"],
    # False: ``jobs.diagnostics`` (ping, sleep, fail, retry_later, fanout) is not
    # imported at start-up, even when OPERATION_MODULES lists it.
    "DIAGNOSTIC_OPERATIONS": True,
}

_BOOL_TRUE = {"1", "true", "yes", "on"}


def _coerce(name: str, raw: str) -> Any:
    default = DEFAULTS.get(name)
    if isinstance(default, bool):
        return raw.strip().lower() in _BOOL_TRUE
    if isinstance(default, int):
        return int(float(raw))
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, list):
        return [part.strip() for part in raw.split(",") if part.strip()]
    return raw


def json_knob(name: str) -> Any:
    """A knob holding a JSON document: parsed when it comes from the environment (text).

    Empty text or None reads as ``{}``; text that is not JSON is ``ImproperlyConfigured``.
    Anything else is returned as it is, for the caller's own checks.
    """
    raw = knob(name)
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(f"CONTROLPLANE_{name} must be a JSON object.") from None
    return {} if raw is None else raw


def knob(name: str) -> Any:
    """Return the current value of a knob (environment first, then settings)."""
    raw = os.environ.get(f"CONTROLPLANE_{name}")
    if raw is not None and raw != "":
        return _coerce(name, raw)
    configured = getattr(settings, "CONTROLPLANE", {}) or {}
    if name in configured:
        return configured[name]
    try:
        return DEFAULTS[name]
    except KeyError:
        raise KeyError(f"Unknown control-plane setting {name!r}.") from None
