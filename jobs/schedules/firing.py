"""Firing schedules: the reaper's part, safe with any number of reapers at once.

Each due schedule is fired in one transaction that holds its row (``FOR
UPDATE SKIP LOCKED`` on PostgreSQL, so a second reaper moves on to other
schedules instead of waiting) and, for each slot it fires:

1. claims the slot by inserting ``ScheduleFire(schedule, fire_at)`` with
   ``ON CONFLICT DO NOTHING`` on the unique ``schedulefire_slot_unique``:
   only the process whose row went in goes on; another one that fired the
   same slot sees no row come back and enqueues nothing;
2. enqueues the job (``Job.schedule`` set, its ``job.enqueued`` event naming
   the schedule), or for a workflow schedule starts the workflow
   (``jobs.workflow_specs.start_workflow``, ``Workflow.schedule`` set, the
   fire row naming it) — or, with ``overlap = skip`` while an earlier run of
   the schedule is still active (a job queued or running; a workflow running
   or held for an operator), records ``skipped_overlap`` instead;
3. moves ``next_fire_at`` past now and sets ``last_fire_at``.

All of it commits together or not at all, so the unique row, not timing,
is what makes a slot fire exactly once: a workflow's row and all its steps
included.

Missed slots (no reaper ran) follow the schedule's ``catch_up``:

- ``none``: only the newest due slot fires, and only when it is less than
  ``SCHEDULE_MISFIRE_GRACE_SECONDS`` late; older slots are skipped.
- ``one`` (the default): the newest due slot fires once for all of them.
- ``all``: every due slot fires, the newest ``SCHEDULE_CATCH_UP_MAX`` of them;
  older ones are skipped.

Either way ``next_fire_at`` then moves to the first slot after now: never a storm.

Firing is time-boxed: one call fires for at most ``SCHEDULE_FIRE_BUDGET_SECONDS``,
the most overdue (earliest ``next_fire_at``) first, so that a thousand due
schedules cannot crowd out the reaper's other duties. The budget is checked
between schedules and between the slots of a ``catch_up = all`` backlog
(whose ``next_fire_at`` then becomes its first slot not fired); at least one
slot fires per call. What is left keeps its ``next_fire_at`` and is simply
still due: the next call (the reaper's timer wakes again at once) fires it
first, its missed slots by its ``catch_up`` as after any short delay. A
deferral is bounded by one round through the due schedules, so under
``catch_up = all`` every deferred slot still fires, as long as the round is
shorter than ``SCHEDULE_CATCH_UP_MAX`` slots.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Min

from jobs.clock import db_now
from jobs.conf import knob
from jobs.dialect import dialect
from jobs.enqueue import enqueue
from jobs.events import JOB_ENQUEUED
from jobs.exceptions import EnqueueError
from jobs.models import (
    CatchUp,
    EventLevel,
    Job,
    JobEvent,
    Overlap,
    Schedule,
    ScheduleFire,
    Workflow,
)
from jobs.schedules.timing import Timing, TimingError
from jobs.states import ACTIVE
from jobs.workflow_specs import start_workflow
from jobs.workflows import ACTIVE_WORKFLOW

log = logging.getLogger("jobs.schedules")

ENQUEUED = "enqueued"
SKIPPED_OVERLAP = "skipped_overlap"
ENQUEUE_FAILED = "enqueue_failed"
RUN_NOW = "run_now"
OUTCOMES = (ENQUEUED, SKIPPED_OVERLAP, ENQUEUE_FAILED, RUN_NOW)

# Due schedules read per round, and rounds per call: a huge backlog is
# worked off over several reaper passes, each bounded.
BATCH = 100
ROUNDS = 10


@dataclass
class FireResult:
    """What one call did: slots fired into jobs, skipped for overlap, refused by enqueue."""

    fired: int = 0
    skipped_overlap: int = 0
    failed: int = 0
    # Due schedules the call left for the next one (its time budget, or its bound, ran out).
    left: int = 0

    def add(self, other: FireResult) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in asdict(self).items())


def slots_to_fire(timing: Timing, catch_up: str, since: datetime, now: datetime) -> list[datetime]:
    """The slots from ``since`` (the stored ``next_fire_at``) to ``now`` that fire now.

    The catch-up policy of this module's docstring; bounded whatever the gap.
    """
    if catch_up == CatchUp.ALL:
        return timing.slots(since, now, newest=max(1, int(knob("SCHEDULE_CATCH_UP_MAX"))))
    newest = timing.slots(since, now, newest=1)
    grace = timedelta(seconds=float(knob("SCHEDULE_MISFIRE_GRACE_SECONDS")))
    if catch_up == CatchUp.NONE and newest and newest[0] < now - grace:
        return []
    return newest


def fire_due_schedules(now: datetime | None = None, *, budget: float | None = None) -> FireResult:
    """Fire the schedules whose ``next_fire_at`` is at or before ``now`` (default: now).

    The reaper calls it on each pass and whenever a schedule falls due in
    between. Schedules another process is firing at this moment are left to
    it (PostgreSQL), or found already advanced once their turn comes (SQLite).

    Most overdue first, for at most ``budget`` seconds (default
    ``SCHEDULE_FIRE_BUDGET_SECONDS``; 0 or less: no limit) and at most
    ``ROUNDS * BATCH`` schedules; ``left`` in the result counts the due
    schedules it did not get to, which stay due for the next call.
    """
    now = now or db_now()
    if budget is None:
        budget = float(knob("SCHEDULE_FIRE_BUDGET_SECONDS"))
    deadline = time.monotonic() + budget if budget > 0 else math.inf
    result = FireResult()
    due_now = Schedule.objects.filter(paused=False, next_fire_at__lte=now)
    tried = 0
    for _ in range(ROUNDS):
        # Only the ids: each schedule's row is read again under its lock.
        due = list(due_now.order_by("next_fire_at", "pk").values_list("pk", flat=True)[:BATCH])
        for schedule_id in due:
            if tried and time.monotonic() >= deadline:
                result.left = due_now.count()
                return result
            tried += 1
            result.add(_fire_schedule(schedule_id, now, deadline))
        if len(due) < BATCH:
            if time.monotonic() >= deadline:  # a schedule's backlog may have been cut
                result.left = due_now.count()
            return result
    result.left = due_now.count()
    return result


def _fire_schedule(schedule_id: uuid.UUID, now: datetime, deadline: float = math.inf) -> FireResult:
    """Fire one schedule's due slots in one transaction; past ``deadline`` (monotonic),
    after at least one slot, the rest wait: ``next_fire_at`` becomes the first
    slot not fired, so the schedule stays due and goes on from there."""
    result = FireResult()
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update(skip_locked=True)
            .filter(pk=schedule_id, paused=False, next_fire_at__lte=now)
            .first()
        )
        if schedule is None:  # another reaper holds it or has fired it; or it was paused
            return result
        timing = Timing.of(schedule)
        since = schedule.next_fire_at
        try:
            slots = slots_to_fire(timing, schedule.catch_up, since, now)
            following = timing.next_after(now)
        except TimingError as error:  # e.g. a time zone the installed tz database lost
            log.error("schedule.unusable name=%s error=%s", schedule.name, error)
            slots, following = [], None
        if since is not None and (now - since).total_seconds() > float(
            knob("SCHEDULE_MISFIRE_GRACE_SECONDS")
        ):
            log.warning(
                "schedule.missed name=%s since=%s catch_up=%s firing=%d",
                schedule.name,
                since.isoformat(),
                schedule.catch_up,
                len(slots),
            )
        last = None
        for index, fire_at in enumerate(slots):
            if index and time.monotonic() >= deadline:  # catch_up "all": the rest next time
                following = fire_at
                break
            outcome = fire_slot(schedule, fire_at, now)
            if outcome is None:
                continue
            last = fire_at
            if outcome == SKIPPED_OVERLAP:
                result.skipped_overlap += 1
            elif outcome == ENQUEUE_FAILED:
                result.failed += 1
            else:
                result.fired += 1
        changes: dict[str, Any] = {"next_fire_at": following}
        if last is not None and (schedule.last_fire_at is None or last > schedule.last_fire_at):
            changes["last_fire_at"] = last
        Schedule.objects.filter(pk=schedule.pk, next_fire_at=since).update(**changes)
    return result


def fire_slot(
    schedule: Schedule, fire_at: datetime, now: datetime, *, outcome: str = ENQUEUED
) -> str | None:
    """Claim one slot of ``schedule`` and act on it; None when the slot was already claimed.

    Call inside a transaction: the claim, the job and its event commit
    together. Returns the outcome recorded on the ``ScheduleFire`` row.
    ``run_now`` fires ignore the overlap policy (an operator asked).
    """
    if outcome == ENQUEUED and schedule.overlap == Overlap.SKIP and still_active(schedule):
        outcome = SKIPPED_OVERLAP
    fire_id = claim_slot(schedule.pk, fire_at, now, outcome)
    if fire_id is None:
        return None
    if outcome == SKIPPED_OVERLAP:
        log.info("schedule.skipped_overlap name=%s fire_at=%s", schedule.name, fire_at.isoformat())
        return outcome
    try:
        start_for(schedule, fire_at, fire_id=fire_id)
    except EnqueueError as error:
        if outcome == RUN_NOW:
            raise
        log.warning(
            "schedule.enqueue_failed name=%s fire_at=%s error=%s errors=%s",
            schedule.name,
            fire_at.isoformat(),
            error.message,
            error.errors,
        )
        ScheduleFire.objects.filter(pk=fire_id).update(outcome=ENQUEUE_FAILED)
        return ENQUEUE_FAILED
    return outcome


def still_active(schedule: Schedule) -> bool:
    """Whether an earlier run of the schedule is active: for ``overlap = skip``.

    A job schedule's job queued or running; a workflow schedule's workflow
    running or held (a failed step waits for an operator: not over yet).
    """
    if schedule.workflow is not None:
        return Workflow.objects.filter(schedule_id=schedule.pk, status__in=ACTIVE_WORKFLOW).exists()
    return Job.objects.filter(schedule_id=schedule.pk, status__in=ACTIVE).exists()


def start_for(
    schedule: Schedule, fire_at: datetime, *, fire_id: int | None = None
) -> Job | Workflow:
    """What one fire of ``schedule`` makes: its job, or for a workflow schedule its workflow.

    Call inside the transaction that claimed the slot: what is made commits
    with the claim or not at all.
    """
    if schedule.workflow is None:
        return enqueue_for(schedule, fire_at, fire_id=fire_id)
    run = start_workflow(schedule.workflow, schedule=schedule.pk)
    if fire_id is not None:
        ScheduleFire.objects.filter(pk=fire_id).update(workflow=run)
    log.info(
        "schedule.workflow_started name=%s fire_at=%s workflow=%s",
        schedule.name,
        fire_at.isoformat(),
        run.pk,
    )
    return run


def enqueue_for(schedule: Schedule, fire_at: datetime, *, fire_id: int | None = None) -> Job:
    """The schedule's job for ``fire_at``; its ``job.enqueued`` event names the schedule.

    With ``fire_id``, the slot's ``ScheduleFire`` row is pointed at the job too
    (on PostgreSQL in the event's statement: one round trip fewer per fire).
    """
    job = enqueue(
        schedule.operation,
        schedule.payload or {},
        queue=schedule.queue or None,
        priority=schedule.priority,
        schedule=schedule.pk,
    )
    # Stored, unlike most jobs' implied one (jobs.timeline), to carry the slot; in the
    # insert's transaction, so nobody sees the job without it.
    fields = {
        "schedule": str(schedule.pk),
        "schedule_name": schedule.name,
        "fire_at": fire_at.isoformat(),
    }
    d = dialect()
    if fire_id is None or not d.postgres:
        JobEvent.objects.create(
            job_id=job.pk, seq=1, ts=job.created_at, event=JOB_ENQUEUED, fields=fields
        )
        if fire_id is not None:
            ScheduleFire.objects.filter(pk=fire_id).update(job=job)
        return job
    fire, event = ScheduleFire._meta, JobEvent._meta
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH fire AS (UPDATE {fire.db_table} SET {fire.get_field('job').column} = %s "
            f"WHERE id = %s) INSERT INTO {event.db_table} "
            "(job_id, seq, ts, event, level, message, fields) "
            f"VALUES (%s, 1, %s, %s, %s, '', {d.json_param})",
            [
                d.uuid(job.pk),
                fire_id,
                d.uuid(job.pk),
                d.ts(job.created_at),
                JOB_ENQUEUED,
                EventLevel.INFO.value,
                d.json(fields),
            ],
        )
    return job


def claim_slot(
    schedule_id: uuid.UUID, fire_at: datetime, now: datetime, outcome: str
) -> int | None:
    """Insert the slot's ``ScheduleFire`` row; its id, or None when the slot was taken.

    ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` (PostgreSQL and SQLite
    alike): the unique (schedule, fire_at) decides, and a conflict leaves the
    transaction usable.
    """
    d = dialect()
    meta = ScheduleFire._meta
    column = {name: meta.get_field(name).column for name in ("schedule", "fire_at")}
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {meta.db_table} ({column['schedule']}, {column['fire_at']}, fired_at, "
            f"outcome) VALUES (%s, %s, %s, %s) "
            f"ON CONFLICT ({column['schedule']}, {column['fire_at']}) DO NOTHING RETURNING id",
            [d.uuid(schedule_id), d.ts(fire_at), d.ts(now), outcome],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])


def prune_fires(cutoff: datetime, limit: int) -> int:
    """Delete up to ``limit`` fire records of slots before ``cutoff`` (retention); how many.

    A schedule's history is its recent fires; its ``last_fire_at`` stays on
    the schedule. A slot older than any ``next_fire_at`` is never fired
    again, so its record is no longer needed to keep it from firing twice.
    """
    old = ScheduleFire.objects.filter(fire_at__lt=cutoff).order_by()  # unsorted: any old ones
    ids = list(old.values_list("pk", flat=True)[:limit])
    if not ids:
        return 0
    deleted, _ = ScheduleFire.objects.filter(pk__in=ids).delete()
    return deleted


class FireTimer:
    """When the reaper next looks at schedules, between its passes.

    It wakes at the earliest ``next_fire_at`` (so an every-second schedule
    fires on time) and at least every ``SCHEDULE_POLL_SECONDS`` (so a schedule
    created, changed or resumed meanwhile is seen that soon). Each wake-up
    fires for at most ``SCHEDULE_FIRE_BUDGET_SECONDS``; what it leaves is
    still due, so the timer is due again at once, and the reaper checks its
    workers' liveness (and starts its next pass) in between.
    """

    def __init__(self, poll_seconds: float | None = None) -> None:
        self.poll_seconds = float(
            knob("SCHEDULE_POLL_SECONDS") if poll_seconds is None else poll_seconds
        )
        self._wake = 0.0  # time.monotonic(): due at once

    def seconds_until_due(self) -> float:
        return max(0.0, self._wake - time.monotonic())

    def fire_if_due(self) -> FireResult | None:
        """Fire what is due when the timer is; None when it is not time yet."""
        if time.monotonic() < self._wake:
            return None
        # Should this fail, the next try is a poll away, not a busy loop.
        self._wake = time.monotonic() + self.poll_seconds
        result = fire_due_schedules()
        self.plan()
        return result

    def plan(self) -> None:
        """Set the next wake-up from the earliest ``next_fire_at`` of a live schedule."""
        earliest = Schedule.objects.filter(paused=False, next_fire_at__isnull=False).aggregate(
            earliest=Min("next_fire_at")
        )["earliest"]
        wait = self.poll_seconds
        if earliest is not None:
            # A few milliseconds late rather than early: an early wake finds nothing due.
            until = (earliest - db_now()).total_seconds() + 0.003
            wait = min(wait, max(until, 0.0))
        self._wake = time.monotonic() + wait
