"""Queue figures for operators: counts by state, backlog age, throughput, pause state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, Min, Q
from django.utils import timezone

from jobs.models import BatchMessage, Job, Queue
from jobs.selectors.filters import STATES
from jobs.states import RUNNING, TERMINAL, Status


@dataclass
class QueueStats:
    name: str
    kind: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    oldest_queued_age: float | None = None
    paused: bool = False
    concurrency_cap: int | None = None
    rate_limit_per_second: float | None = None
    finished_last_minute: int = 0
    finished_last_hour: int = 0
    pending_messages: int = 0

    @property
    def running(self) -> int:
        return self.counts.get(RUNNING, 0)

    @property
    def throughput(self) -> dict[str, int]:
        return {"last_minute": self.finished_last_minute, "last_hour": self.finished_last_hour}


def queue_stats(names: Sequence[str] | None = None) -> list[QueueStats]:
    """Every queue (Queue rows, queues named by jobs or batch messages), sorted by name.

    ``oldest_queued_age`` is the age in seconds of the oldest queued job (by
    ``created_at``); throughput counts jobs that finished in the last minute
    and hour. ``names`` restricts the result to those queues.
    """
    now = timezone.now()
    jobs = Job.objects.order_by()
    rows = Queue.objects.all()
    messages = BatchMessage.objects.order_by()
    if names is not None:
        jobs, rows, messages = (
            jobs.filter(queue__in=names),
            rows.filter(name__in=names),
            messages.filter(queue__in=names),
        )
    stats: dict[str, QueueStats] = {}

    def get(name: str) -> QueueStats:
        if name not in stats:
            stats[name] = QueueStats(name=name, kind=Queue.default_kind(name))
        return stats[name]

    for row in rows:
        entry = get(row.name)
        entry.kind, entry.paused, entry.concurrency_cap = row.kind, row.paused, row.concurrency_cap
        entry.rate_limit_per_second = row.rate_limit_per_second
    for queue, status, n in jobs.values_list("queue", "status").annotate(n=Count("id")):
        get(queue).counts[status] = n
    queued = jobs.filter(status=Status.QUEUED)
    oldest = queued.values_list("queue").annotate(oldest=Min("created_at"))
    for queue, first in oldest:
        get(queue).oldest_queued_age = round(max((now - first).total_seconds(), 0.0), 3)
    hour = jobs.filter(status__in=list(TERMINAL), finished_at__gte=now - timedelta(hours=1))
    minute_ago = now - timedelta(minutes=1)
    for queue, last_hour, last_minute in hour.values_list("queue").annotate(
        h=Count("id"), m=Count("id", filter=Q(finished_at__gte=minute_ago))
    ):
        entry = get(queue)
        entry.finished_last_hour, entry.finished_last_minute = last_hour, last_minute
    for queue, n in messages.values_list("queue").annotate(n=Count("id")):
        get(queue).pending_messages = n
    if names is not None:
        for name in names:
            get(name)
    return [stats[name] for name in sorted(stats)]


def queue_detail(name: str) -> QueueStats:
    """One queue's figures; a queue nobody has used yet reads as empty."""
    return queue_stats([name])[0]
