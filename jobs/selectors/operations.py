"""What an operator may enqueue: every local operation and every visible remote declaration.

Local operations come from the process's registry (``jobs.operations.registry``);
remote ones from the ``RemoteOperation`` rows that are not hidden. A remote
declaration whose workers have all left is still listed (``online`` false)
and still ``enqueueable`` within ``REMOTE_OPERATION_GRACE_SECONDS`` of its
``last_seen_at`` (``jobs.remote_operations``). A remote row named like a local
operation is shadowed by it, as enqueue resolves the local one first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from jobs.models import RemoteOperation, Worker, WorkerKind
from jobs.operations import Operation, registry
from jobs.remote_operations import alive_since, enqueueable, seen_at, served_operations

LOCAL = "local"
REMOTE = "remote"


@dataclass(frozen=True)
class OperationInfo:
    """One enqueueable operation as the API and the dashboard show it."""

    name: str
    queue: str
    max_attempts: int
    payload_schema: dict[str, Any]
    kind: str  # LOCAL or REMOTE
    description: str
    # A live worker serves it now: for a local operation one serving its queue
    # (or a remote worker naming it), for a remote one a worker declaring it.
    online: bool
    # Enqueue accepts it now (always for a local operation).
    enqueueable: bool
    # Remote only: when a worker declaring it was last known alive.
    last_seen_at: datetime | None = None


def _local_info(op: Operation, *, online: bool) -> OperationInfo:
    return OperationInfo(
        name=op.name,
        queue=op.queue,
        max_attempts=op.max_attempts,
        payload_schema=op.payload_schema,
        kind=LOCAL,
        description=op.description,
        online=online,
        enqueueable=True,
    )


def _remote_info(row: RemoteOperation, *, now: datetime, served: set[str]) -> OperationInfo:
    return OperationInfo(
        name=row.name,
        queue=row.queue,
        max_attempts=row.max_attempts,
        payload_schema=row.payload_schema or {"type": "object"},
        kind=REMOTE,
        description="",
        online=row.name in served,
        enqueueable=enqueueable(row, now=now, served=served),
        last_seen_at=seen_at(row),
    )


def _served_local_queues(now: datetime) -> set[str]:
    """The queues some live local worker serves (local workers run every registered operation)."""
    queues: set[str] = set()
    live = Worker.objects.filter(kind=WorkerKind.LOCAL, last_heartbeat__gte=alive_since(now))
    for served in live.values_list("queues", flat=True):
        queues.update(q for q in served or [] if isinstance(q, str))
    return queues


def operation_list() -> list[OperationInfo]:
    """Every operation enqueue accepts by name, local and remote-declared, sorted by name.

    Three queries whatever the number of operations: the visible remote
    rows, the remote workers, the live local workers.
    """
    now = timezone.now()
    served = served_operations(now)
    queues = _served_local_queues(now)
    out = [_local_info(op, online=op.queue in queues or op.name in served) for op in registry.all()]
    rows = RemoteOperation.objects.filter(deleted=False).exclude(name__in=registry.names())
    out += [_remote_info(row, now=now, served=served) for row in rows]
    return sorted(out, key=lambda info: info.name)


def operation_get(name: str) -> OperationInfo | None:
    """One operation as ``operation_list`` shows it, or None when enqueue would not know it."""
    now = timezone.now()
    if name in registry:
        op = registry.get(name)
        served = served_operations(now)
        online = op.name in served or op.queue in _served_local_queues(now)
        return _local_info(op, online=online)
    row = RemoteOperation.objects.filter(name=name, deleted=False).first()
    if row is None:
        return None
    return _remote_info(row, now=now, served=served_operations(now))
