"""Worker and reaper configuration: frozen dataclasses with named defaults from the knobs.

Also the worker class ``runworker`` runs (``WORKER_CLASS``): a host's
``workers.engine.JobWorker`` subclass with its own hooks.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from jobs.conf import knob

if TYPE_CHECKING:
    from workers.engine import JobWorker


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


def worker_class(path: str | None = None) -> type[JobWorker]:
    """The class ``runworker`` (and each ``--processes`` child) runs: ``WORKER_CLASS``.

    A dotted path to a ``workers.engine.JobWorker`` subclass (its
    ``pre_dequeue``/``pre_handle``/``post_handle`` hooks are the reason to
    set it). Raises ``ImproperlyConfigured`` with what to fix when the path
    does not import or names anything else.
    """
    from workers.engine import JobWorker

    path = knob("WORKER_CLASS") if path is None else path
    if not path:
        return JobWorker
    if not isinstance(path, str):
        raise ImproperlyConfigured(
            f"CONTROLPLANE['WORKER_CLASS'] is {path!r}; give the dotted path of a "
            "workers.engine.JobWorker subclass as text, e.g. 'myapp.workers.MyWorker'."
        )
    try:
        found = import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"CONTROLPLANE['WORKER_CLASS'] = {path!r} cannot be imported ({error}); give the "
            "dotted path of a workers.engine.JobWorker subclass, e.g. 'myapp.workers.MyWorker'."
        ) from error
    if not (isinstance(found, type) and issubclass(found, JobWorker)):
        raise ImproperlyConfigured(
            f"CONTROLPLANE['WORKER_CLASS'] = {path!r} names {found!r}, which is not a subclass "
            "of workers.engine.JobWorker; subclass it and override its hooks."
        )
    return found


def check_worker_class(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: ``WORKER_CLASS`` imports and is a ``JobWorker`` subclass."""
    try:
        worker_class()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                str(error),
                hint="Fix CONTROLPLANE['WORKER_CLASS'] (or CONTROLPLANE_WORKER_CLASS), "
                "or remove it to run workers.engine.JobWorker.",
                id="controlplane.E030",
            )
        ]
    return []


def check_key_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: ``KEYS`` and the operations' declared key limits are valid and agree."""
    from jobs.key_limits import declared_limits

    try:
        declared_limits()
    except ImproperlyConfigured as error:
        return [
            checks.Error(
                str(error),
                hint="Fix CONTROLPLANE['KEYS'] (or CONTROLPLANE_KEYS), or the operations' "
                "keys=[Key(...)] declarations (docs/flow-control.md).",
                id="controlplane.E031",
            )
        ]
    return []
