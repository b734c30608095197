"""Worker and reaper configuration: frozen dataclasses with named defaults from the knobs."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from jobs.conf import knob


@dataclass(frozen=True)
class WorkerConfig:
    queues: tuple[str, ...]
    concurrency: int = 1
    burst: bool = False
    name: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    worker_id: str | None = None
    lease_seconds: float = field(default_factory=lambda: float(knob("LEASE_SECONDS")))
    heartbeat_seconds: float = field(default_factory=lambda: float(knob("HEARTBEAT_SECONDS")))
    poll_seconds: float = field(default_factory=lambda: float(knob("POLL_SECONDS")))
    poll_only: bool = field(default_factory=lambda: bool(knob("POLL_ONLY")))
    shutdown_grace_seconds: float = field(
        default_factory=lambda: float(knob("SHUTDOWN_GRACE_SECONDS"))
    )
    shutdown_cleanup_seconds: float = field(
        default_factory=lambda: float(knob("SHUTDOWN_CLEANUP_SECONDS"))
    )
    retry_backoff_seconds: float = field(
        default_factory=lambda: float(knob("RETRY_BACKOFF_SECONDS"))
    )
    retry_backoff_max_seconds: float = field(
        default_factory=lambda: float(knob("RETRY_BACKOFF_MAX_SECONDS"))
    )
    max_outage_requeues: int = field(default_factory=lambda: int(knob("MAX_OUTAGE_REQUEUES")))
    batch_visibility_seconds: float = field(
        default_factory=lambda: float(knob("BATCH_VISIBILITY_SECONDS"))
    )
    # Queue settings (paused, caps) are re-read at most this often.
    queue_settings_ttl: float = 1.0

    def __post_init__(self) -> None:
        if not self.queues:
            raise ValueError("A worker needs at least one queue (--queue NAME).")
        if self.concurrency < 1:
            raise ValueError("--concurrency must be at least 1.")


@dataclass(frozen=True)
class ReaperConfig:
    interval_seconds: float = field(default_factory=lambda: float(knob("REAPER_INTERVAL_SECONDS")))
    timeout_seconds: float = field(default_factory=lambda: float(knob("REAPER_TIMEOUT_SECONDS")))
    stall_seconds: float = field(default_factory=lambda: float(knob("REAPER_STALL_SECONDS")))
    max_lease_requeues: int = field(default_factory=lambda: int(knob("MAX_LEASE_REQUEUES")))
    worker_timeout_seconds: float = field(
        default_factory=lambda: float(knob("WORKER_TIMEOUT_SECONDS"))
    )
    worker_lost_seconds: float = field(default_factory=lambda: float(knob("WORKER_LOST_SECONDS")))
    worker_liveness_seconds: float = field(
        default_factory=lambda: float(knob("WORKER_LIVENESS_SECONDS"))
    )
    timeout_grace_seconds: float = field(
        default_factory=lambda: float(knob("TIMEOUT_GRACE_SECONDS"))
    )
    retention_days: float = field(default_factory=lambda: float(knob("RETENTION_DAYS")))
    retention_batch_size: int = field(default_factory=lambda: int(knob("RETENTION_BATCH_SIZE")))
    batch_size: int = 500
