"""Reading the event table in id order without losing events that commit late; and new jobs.

Event ids are handed out at insert but become visible at commit, so a big
transaction (an enqueue of thousands of jobs, a long operation's batch) can
commit after rows with higher ids were already read. A plain "id > last"
cursor would skip it for good. ``EventCursor`` remembers every id it stepped
over as a *hole* and looks the holes up again on each read until the rows
show up or ``RELAY_HOLE_SECONDS`` pass (rolled-back inserts leave holes that
never fill). Each event is returned once.

Holes are kept as id ranges, so a 10,000-row transaction still in flight is
one range, not 10,000 ids; the lookup is one indexed range scan per range.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from dashboard.conf import setting
from jobs.models import Job, JobEvent

BATCH = 5000
MAX_HOLES = 200  # ranges of skipped ids kept; the oldest go first

Row = tuple[int, uuid.UUID, int, str]  # id, job id, seq, event name
COLUMNS = ("id", "job_id", "seq", "event")


@dataclass(frozen=True)
class Hole:
    """Event ids ``low..high`` skipped over (not committed yet, or rolled back), since when."""

    low: int
    high: int
    since: float


def max_event_id() -> int:
    return JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


class EventCursor:
    """Where a reader of the event table stands: its last id and the holes below it."""

    def __init__(self, last_id: int | None = None) -> None:
        self.last_id = last_id
        self.holes: list[Hole] = []

    def read(self) -> tuple[list[Row], bool]:
        """Rows that appeared since the last read, ascending within each part; and whether a
        part hit ``BATCH`` (read again soon for the rest)."""
        if self.last_id is None:
            self.last_id = max_event_id()
        late = self._read_holes()
        rows = list(
            JobEvent.objects.filter(id__gt=self.last_id)
            .order_by("id")
            .values_list(*COLUMNS)[:BATCH]
        )
        if not rows and not late and self.last_id > 0:
            if not JobEvent.objects.filter(id__lte=self.last_id).exists():
                self.last_id, self.holes = 0, []  # the table was emptied
        expected = self.last_id + 1
        for row in rows:
            if row[0] > expected:
                self._add_hole(expected, row[0] - 1)
            expected = row[0] + 1
        if rows:
            self.last_id = rows[-1][0]
        return late + rows, len(rows) >= BATCH or len(late) >= BATCH

    def _read_holes(self) -> list[Row]:
        horizon = time.monotonic() - float(setting("RELAY_HOLE_SECONDS"))
        self.holes = [h for h in self.holes if h.since >= horizon]
        if not self.holes:
            return []
        in_holes = Q()
        for hole in self.holes:
            in_holes |= Q(id__range=(hole.low, hole.high))
        late = list(JobEvent.objects.filter(in_holes).order_by("id").values_list(*COLUMNS)[:BATCH])
        self._fill([r[0] for r in late], complete=len(late) < BATCH)
        return late

    def _add_hole(self, low: int, high: int) -> None:
        self.holes.append(Hole(low, high, time.monotonic()))
        if len(self.holes) > MAX_HOLES:
            self.holes = self.holes[-MAX_HOLES:]

    def _fill(self, found: list[int], *, complete: bool) -> None:
        """Cut the ids just read (ascending) out of the holes; if the read was cut short
        at ``BATCH``, only up to the last id read counts."""
        cutoff = None if complete or not found else found[-1]
        holes: list[Hole] = []
        for hole in self.holes:
            top = hole.high if cutoff is None else min(hole.high, cutoff)
            start = hole.low
            for i in found[bisect_left(found, hole.low) : bisect_right(found, top)]:
                if i > start:
                    holes.append(Hole(start, i - 1, hole.since))
                start = i + 1
            if start <= hole.high:
                holes.append(Hole(start, hole.high, hole.since))
        self.holes = holes


class NewJobCursor:
    """Jobs created since the last read, newest first, each reported once.

    Most jobs have no stored ``job.enqueued`` event (``jobs.timeline``), so the
    event cursor does not see them arrive; the job table's creation-time index
    does. ``created_at`` is taken before the insert and the row becomes
    visible at commit, so each read looks back ``RELAY_NEW_JOBS_LOOKBACK_SECONDS``
    before the newest creation time seen and skips the ids already reported:
    a transaction that stays open longer than that is not announced live (the
    list shows its jobs when it is next loaded). At most ``BATCH`` rows are
    read, newest first: in a flood the newest are reported (more than
    ``RELAY_NEW_JOBS_MAX`` tell the page there are many) and older ones in
    the window are not looked at again.
    """

    def __init__(self) -> None:
        self.newest: datetime | None = None
        self.seen: dict[uuid.UUID, datetime] = {}

    def prime(self) -> None:
        """Start from now: the jobs already there are the page's own, not new."""
        self.newest = timezone.now()
        self.seen = {}
        self.read()

    def read(self) -> list[uuid.UUID]:
        """Ids of jobs not reported before, newest first."""
        if self.newest is None:
            self.prime()
            return []
        floor = self.newest - timedelta(seconds=float(setting("RELAY_NEW_JOBS_LOOKBACK_SECONDS")))
        rows = list(
            Job.objects.filter(created_at__gt=floor)
            .order_by("-created_at", "-id")
            .values_list("id", "created_at")[:BATCH]
        )
        new = [job_id for job_id, _ in rows if job_id not in self.seen]
        if rows:
            self.newest = max(self.newest, rows[0][1])
        horizon = self.newest - timedelta(seconds=float(setting("RELAY_NEW_JOBS_LOOKBACK_SECONDS")))
        self.seen = {job_id: at for job_id, at in self.seen.items() if at > horizon}
        self.seen.update((job_id, at) for job_id, at in rows if at > horizon)
        return new
