"""Queues spread over several databases: which database holds each queue's jobs.

Past what one PostgreSQL primary can take (docs/scaling.md), each queue lives
on exactly one database, a *shard*: a complete control plane schema
(``manage.py migrate --database <alias>``) with its own workers, reaper and
web tier. Nothing crosses shards: a job, its events, its children and its
batches stay on the database its queue maps to, so every guarantee of one
database (claims, fencing, events in the same transaction, unique keys,
caps and rate limits) holds per shard unchanged.

Producers route by queue through ``QueueShards``; workers need no router: a
worker process serves the queues of one shard, started with that shard's
``DATABASE_URL``. The map comes from ``CONTROLPLANE["QUEUE_SHARDS"]``
(``{"queue": "alias"}``, unlisted queues on ``default``), every alias a
``DATABASES`` entry. Moving a queue to another shard is an operation, not a
setting change: drain it (pause producers, let workers finish), then switch.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job
from jobs.operations import registry


@dataclass(frozen=True)
class QueueShards:
    """A fixed map from queue name to database alias; unlisted queues use ``default``."""

    routes: Mapping[str, str] = field(default_factory=dict)
    default: str = "default"

    def __post_init__(self) -> None:
        unknown = sorted({self.default, *self.routes.values()} - set(settings.DATABASES))
        if unknown:
            raise ImproperlyConfigured(
                f"QUEUE_SHARDS names database aliases that DATABASES lacks: {', '.join(unknown)}. "
                "Add each shard to DATABASES (and migrate it) or fix the map."
            )

    @classmethod
    def from_settings(cls) -> QueueShards:
        """The map in ``CONTROLPLANE["QUEUE_SHARDS"]`` (empty: everything on ``default``)."""
        configured = getattr(settings, "CONTROLPLANE", {}) or {}
        return cls(dict(configured.get("QUEUE_SHARDS") or {}))

    @property
    def aliases(self) -> list[str]:
        """Every shard, ``default`` first."""
        return [self.default, *sorted(set(self.routes.values()) - {self.default})]

    def alias_for(self, queue: str | None) -> str:
        """The database that holds ``queue``'s jobs."""
        return self.routes.get(queue, self.default) if queue is not None else self.default

    def alias_for_spec(self, spec: JobSpec) -> str:
        """The shard of the queue ``spec`` lands on: its own, else its local operation's.

        A remote-declared operation's default queue is not known here: name
        the queue when enqueueing one on a sharded deployment.
        """
        queue = spec.queue
        if queue is None and spec.operation in registry:
            queue = registry.get(spec.operation).queue
        return self.alias_for(queue)

    def enqueue(self, operation: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """``jobs.enqueue.enqueue`` on the shard of ``options["queue"]`` (``default`` if none)."""
        spec = JobSpec(operation=operation, payload=payload or {}, **options)
        return self.enqueue_many([spec])[0]

    def enqueue_many(self, specs: Sequence[JobSpec]) -> list[Job]:
        """Store each spec on its queue's shard; return the jobs in the order given.

        One ``enqueue_many`` call per shard: atomic within a shard, not across
        shards (a failure on the second shard leaves the first one's jobs). A
        parent and its children must share a queue's shard.
        """
        by_alias: dict[str, list[int]] = {}
        for index, spec in enumerate(specs):
            by_alias.setdefault(self.alias_for_spec(spec), []).append(index)
        jobs: list[Job | None] = [None] * len(specs)
        for alias, indexes in by_alias.items():
            stored = enqueue_many([specs[i] for i in indexes], using=alias)
            for index, job in zip(indexes, stored, strict=True):
                jobs[index] = job
        return [job for job in jobs if job is not None]

    def find_job(self, job_id: uuid.UUID | str) -> Job | None:
        """The job with ``job_id`` on whichever shard holds it (one primary-key probe per shard)."""
        for alias in self.aliases:
            job = Job.objects.using(alias).filter(pk=job_id).first()
            if job is not None:
                return job
        return None
