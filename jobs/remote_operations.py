"""Operations remote workers declared: who serves them now, and how long they outlive their workers.

A remote worker's own operations are ``RemoteOperation`` rows. A redeploy
takes every worker of an operation away for a while (the old processes
disconnect before the new ones register); enqueue must not answer "Unknown
operation" in that gap. So a declared operation stays enqueueable for
``REMOTE_OPERATION_GRACE_SECONDS`` after ``last_seen_at``, the last moment a
worker declaring it was known alive; its jobs wait ``queued`` for the next
worker (local workers never claim them: the row is not ``deleted``). After
the grace, enqueue refuses it with a message that says so, and the reaper's
sweep hides it once no job of it is pending either.

``last_seen_at`` is written by registration and disconnect (now) and by the
sweep (the newest heartbeat of any worker row naming it), never by the
heartbeat itself, which stays two queries.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import UTC, datetime, timedelta

from django.db import transaction

from jobs.clock import db_now
from jobs.conf import knob
from jobs.exceptions import UnknownOperation
from jobs.models import Job, RemoteOperation, Worker, WorkerKind
from jobs.states import ACTIVE

__all__ = [
    "DeclarationExpired",
    "UndeclaredOperation",
    "alive_since",
    "enqueueable",
    "grace_seconds",
    "in_grace",
    "mark_seen",
    "newest_heartbeats",
    "declared_operation",
    "seen_at",
    "served_operations",
    "soft_delete_orphan_operations",
]


def grace_seconds() -> float:
    """``REMOTE_OPERATION_GRACE_SECONDS``, never negative."""
    return max(float(knob("REMOTE_OPERATION_GRACE_SECONDS")), 0.0)


def alive_since(now: datetime) -> datetime:
    """Workers whose heartbeat is at or after this moment are alive (``WORKER_TIMEOUT_SECONDS``)."""
    return now - timedelta(seconds=float(knob("WORKER_TIMEOUT_SECONDS")))


def seen_at(row: RemoteOperation) -> datetime | None:
    """When a worker declaring ``row`` was last known alive; a row that never recorded
    it (created before the column, or by hand) counts from its last change."""
    return row.last_seen_at or row.updated_at


def in_grace(last_seen_at: datetime | None, now: datetime) -> bool:
    """Whether an operation last served at ``last_seen_at`` is still within its grace."""
    return last_seen_at is not None and last_seen_at >= now - timedelta(seconds=grace_seconds())


def newest_heartbeats() -> dict[str, datetime]:
    """Per operation name, the newest heartbeat of any registered remote worker naming it.

    Silent workers not swept yet count too: their last heartbeat is the last
    moment the operation was served. One query over the (few) remote workers.
    """
    newest: dict[str, datetime] = {}
    rows = Worker.objects.filter(kind=WorkerKind.REMOTE).values_list("operations", "last_heartbeat")
    for names, beat in rows:
        for name in names or []:
            if isinstance(name, str) and (name not in newest or beat > newest[name]):
                newest[name] = beat
    return newest


def served_operations(now: datetime | None = None) -> set[str]:
    """The operations some live remote worker declares (heartbeat within the worker timeout)."""
    since = alive_since(now or db_now())
    return {name for name, beat in newest_heartbeats().items() if beat >= since}


def mark_seen(names: Iterable[str], at: datetime) -> int:
    """Record that workers served ``names`` at ``at`` (never moves ``last_seen_at`` back)."""
    wanted = [n for n in names if isinstance(n, str)]
    if not wanted:
        return 0
    return (
        RemoteOperation.objects.filter(name__in=wanted)
        .exclude(last_seen_at__gte=at)
        .update(last_seen_at=at)
    )


def _duration(seconds: float) -> str:
    """``24 hours``, ``90 minutes``, ``30 seconds``: the grace as people read it."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if (seconds >= size and seconds % size == 0) or seconds >= 10 * size:
            value = round(seconds / size)
            return f"{value} {unit}{'' if value == 1 else 's'}"
    value = round(seconds)
    return f"{value} second{'' if value == 1 else 's'}"


class UndeclaredOperation(UnknownOperation):
    """No local operation has this name and no remote worker has declared it recently."""

    def __init__(self, name: str, *, grace: float) -> None:
        super().__init__(name)
        recently = f" in the last {_duration(grace)}" if grace > 0 else ""
        text = (
            f"Unknown operation {name!r}: no local operation has this name and no remote "
            f"worker has declared it{recently}. Check the spelling, or start a worker that "
            "declares it."
        )
        self.message, self.errors, self.args = text, {"operation": [text]}, (text,)


class DeclarationExpired(UnknownOperation):
    """Remote workers declared the operation, but none has served it within the grace."""

    def __init__(self, name: str, *, last_seen_at: datetime | None, grace: float) -> None:
        super().__init__(name)
        since = (
            f"since {last_seen_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
            if last_seen_at is not None
            else "for a long time"
        )
        text = (
            f"Unknown operation {name!r}: remote workers declared it, but none has served it "
            f"{since}, and declared operations stay enqueueable only {_duration(grace)} after "
            "their last worker left (REMOTE_OPERATION_GRACE_SECONDS). Start a worker that "
            "declares it, then enqueue again."
        )
        self.message, self.errors, self.args = text, {"operation": [text]}, (text,)


def declared_operation(name: str) -> RemoteOperation:
    """The declaration enqueue may use for ``name`` now, or the reason it is unknown.

    One query while the operation is served or within its grace (the sweep
    keeps ``last_seen_at`` fresh); a second one, over the remote workers, only
    when ``last_seen_at`` looks old (no reaper running, say) to check that no
    live worker serves it.
    """
    row = RemoteOperation.objects.filter(name=name).first()
    grace = grace_seconds()
    if row is None:
        raise UndeclaredOperation(name, grace=grace)
    now = db_now()
    if row.deleted or not (in_grace(seen_at(row), now) or name in served_operations(now)):
        raise DeclarationExpired(name, last_seen_at=seen_at(row), grace=grace)
    return row


def enqueueable(row: RemoteOperation, *, now: datetime, served: Collection[str]) -> bool:
    """Whether enqueue accepts ``row``'s operation now (the rule of ``declared_operation``)."""
    return not row.deleted and (row.name in served or in_grace(seen_at(row), now))


def soft_delete_orphan_operations() -> int:
    """Hide remote operations no live worker has provided for the grace and no pending job needs.

    First ``last_seen_at`` of every visible operation moves up to the newest
    heartbeat of any worker row naming it. Then an operation is hidden when
    no live worker provides it (a heartbeat within ``WORKER_TIMEOUT_SECONDS``:
    a worker that stopped beating but was not swept yet provides nothing),
    its ``last_seen_at`` is older than ``REMOTE_OPERATION_GRACE_SECONDS``
    (until then it stays enqueueable: a redeploy's gap), and no job of it is
    queued or running. It comes back when a worker declares it again.

    Safe to call any time and from several processes at once: the candidate
    rows are locked, so a registration that declares one of them either
    commits first (and its worker is seen) or un-hides it after. Returns the
    number of operations hidden.
    """
    with transaction.atomic():
        rows = list(RemoteOperation.objects.select_for_update().filter(deleted=False))
        if not rows:
            return 0
        now = db_now()
        newest = newest_heartbeats()
        seen = []
        for row in rows:
            beat = newest.get(row.name)
            if beat is not None and (row.last_seen_at is None or beat > row.last_seen_at):
                row.last_seen_at = beat
                seen.append(row)
        if seen:
            RemoteOperation.objects.bulk_update(seen, ["last_seen_at"])
        since = alive_since(now)
        provided = {name for name, beat in newest.items() if beat >= since}
        recent = {row.name for row in rows if in_grace(seen_at(row), now)}
        candidates = {row.name for row in rows} - provided - recent
        if not candidates:
            return 0
        pending = set(
            Job.objects.filter(status__in=list(ACTIVE), operation__in=candidates)
            .values_list("operation", flat=True)
            .distinct()
        )
        orphans = candidates - pending
        if not orphans:
            return 0
        return RemoteOperation.objects.filter(name__in=orphans, deleted=False).update(
            deleted=True, updated_at=now
        )
