"""Workers as operators see them: liveness and the jobs each one is running.

A worker is live while its heartbeat is younger than ``WORKER_TIMEOUT_SECONDS``;
``stale_before`` is that cutoff, shared by the pages that mark stale workers
and the orphan requeue that must not take a live worker's job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from jobs.conf import knob
from jobs.models import Job, Worker
from jobs.selectors.values import parse_uuid
from jobs.states import RUNNING


@dataclass
class WorkerInfo:
    worker: Worker
    current_jobs: list[uuid.UUID]
    heartbeat_age: float

    def __getattr__(self, name: str) -> Any:
        # Serializers read worker columns straight off this object.
        return getattr(self.__dict__["worker"], name)


def _worker_infos(workers: Sequence[Worker]) -> list[WorkerInfo]:
    now = timezone.now()
    running: dict[uuid.UUID, list[uuid.UUID]] = {w.pk: [] for w in workers}
    if workers:
        held = (
            Job.objects.filter(status=RUNNING, worker_id__in=list(running))
            .order_by("started_at", "id")
            .values_list("worker_id", "id")
        )
        for worker_id, job_id in held:
            running[worker_id].append(job_id)
    return [
        WorkerInfo(
            worker=w,
            current_jobs=running[w.pk],
            heartbeat_age=round(max((now - w.last_heartbeat).total_seconds(), 0.0), 3),
        )
        for w in workers
    ]


def worker_list() -> list[WorkerInfo]:
    """Every registered worker, oldest first, with the ids of the jobs it is running."""
    return _worker_infos(list(Worker.objects.order_by("started_at", "id")))


def worker_detail(worker_id: uuid.UUID | str) -> WorkerInfo | None:
    """One worker with its running jobs, or None when there is no such worker."""
    pk = parse_uuid(worker_id) if not isinstance(worker_id, uuid.UUID) else worker_id
    worker = Worker.objects.filter(pk=pk).first() if pk else None
    return _worker_infos([worker])[0] if worker else None


def stale_before(now: datetime | None = None) -> datetime:
    """The heartbeat time before which a worker counts as stale (``WORKER_TIMEOUT_SECONDS``)."""
    return (now or timezone.now()) - timedelta(seconds=float(knob("WORKER_TIMEOUT_SECONDS")))


def live_worker_ids() -> list[uuid.UUID]:
    """The ids of the workers whose heartbeat is recent enough to count as live."""
    return list(
        Worker.objects.filter(last_heartbeat__gte=stale_before()).values_list("pk", flat=True)
    )
