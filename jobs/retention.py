"""How long finished jobs are kept: by final status and by queue.

The days a finished job is kept before the reaper deletes it (with its
events) are, the first that is set:

1. its queue's retention set by an operator (the queues page, stored on
   ``Queue.retention_days``), for its status, else for any status (``"*"``);
2. its queue's entry in ``QUEUE_RETENTION_DAYS``, the same way
   (``{"reports": {"succeeded": 0.5}}``; a number means every status);
3. ``RETENTION_DAYS_BY_STATUS`` for its status (``{"succeeded": 1, "failed": 30}``);
4. ``RETENTION_DAYS``.

A value is a number of days from 0 (deleted at the next pass) to
``MAX_DAYS``. ``Retention.cuts`` turns the rules into the few deletions a
reaper pass makes; ``Retention.longest`` is the retention no finished job
outlives, which is when a whole event partition may go (``jobs.partitions``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobs.conf import json_knob, knob

FINAL_STATUSES = ("succeeded", "failed", "cancelled")
ANY_STATUS = "*"
MAX_DAYS = 100 * 365.0
DAYS_RULE = f"A retention is a number of days from 0 to {MAX_DAYS:g}."


class RetentionError(ValueError):
    """A retention outside its rule; ``str()`` is a sentence to show as it is."""


def check_days(value: Any, where: str = "The retention") -> float:
    """A number of days from 0 to ``MAX_DAYS`` (not a bool), as a float."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DAYS
    ):
        raise RetentionError(f"{where} must be a number of days from 0 to {MAX_DAYS:g}.")
    return float(value)


def check_queue_retention(value: Any) -> dict[str, float] | None:
    """A queue's retention: days for every status (a number), days by status (a dict of
    ``succeeded``, ``failed``, ``cancelled`` and ``"*"`` for the others), or None (none)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return {ANY_STATUS: check_days(value)}
    out: dict[str, float] = {}
    for status, days in value.items():
        if status not in (*FINAL_STATUSES, ANY_STATUS):
            raise RetentionError(
                f"{status!r} is not a final status; a retention names "
                f"{', '.join(FINAL_STATUSES)} or '*' (any other)."
            )
        out[status] = check_days(days, f"The retention of {status} jobs")
    return out or None


def status_retention() -> dict[str, float]:
    """``RETENTION_DAYS_BY_STATUS``, checked."""
    raw = json_knob("RETENTION_DAYS_BY_STATUS")
    try:
        if not isinstance(raw, dict):
            raise RetentionError('It must map statuses to days, e.g. {"succeeded": 1}.')
        return check_queue_retention(raw) or {}
    except RetentionError as error:
        raise ImproperlyConfigured(f'CONTROLPLANE["RETENTION_DAYS_BY_STATUS"]: {error}') from None


def configured_queue_retention() -> dict[str, dict[str, float]]:
    """``QUEUE_RETENTION_DAYS``, checked: per queue, days by status (``"*"``: any)."""
    raw = json_knob("QUEUE_RETENTION_DAYS")
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            'CONTROLPLANE["QUEUE_RETENTION_DAYS"] must map queue names to days, e.g. '
            '{"reports": {"succeeded": 0.5}}.'
        )
    out: dict[str, dict[str, float]] = {}
    for name, entry in raw.items():
        try:
            checked = check_queue_retention(entry)
        except RetentionError as error:
            raise ImproperlyConfigured(
                f'CONTROLPLANE["QUEUE_RETENTION_DAYS"]["{name}"]: {error}'
            ) from None
        if checked:
            out[str(name)] = checked
    return out


@dataclass(frozen=True)
class Cut:
    """One deletion of a pass: jobs of ``statuses`` finished before ``cutoff``, of ``queues``
    (None: every queue but ``excluded``). ``longest`` when its retention is the longest."""

    statuses: tuple[str, ...]
    cutoff: datetime
    queues: tuple[str, ...] | None = None
    excluded: tuple[str, ...] = ()
    longest: bool = False


@dataclass(frozen=True)
class Retention:
    """The retention rules in force (module docstring), in days."""

    default: float
    statuses: dict[str, float] = field(default_factory=dict)
    configured: dict[str, dict[str, float]] = field(default_factory=dict)
    operator: dict[str, dict[str, float]] = field(default_factory=dict)

    def days(self, queue: str | None, status: str) -> float:
        """How long a finished job of ``queue`` with ``status`` is kept."""
        return self.explain(queue, status)[0]

    def explain(self, queue: str | None, status: str) -> tuple[float, str]:
        """The days and where they come from: ``queue``, ``settings``, ``status`` or ``default``."""
        for rules, source in ((self.operator, "queue"), (self.configured, "settings")):
            entry = rules.get(queue or "")
            if entry:
                for key in (status, ANY_STATUS):
                    if key in entry:
                        return entry[key], source
        if status in self.statuses:
            return self.statuses[status], "status"
        if ANY_STATUS in self.statuses:
            return self.statuses[ANY_STATUS], "status"
        return self.default, "default"

    @property
    def special_queues(self) -> tuple[str, ...]:
        """Queues with rules of their own."""
        return tuple(sorted(set(self.operator) | set(self.configured)))

    @property
    def longest(self) -> float:
        """The longest retention of any finished job."""
        values = [self.default, *self.statuses.values()]
        for rules in (self.operator, self.configured):
            for entry in rules.values():
                values += entry.values()
        return max(values)

    def cuts(self, now: datetime) -> list[Cut]:
        """The deletions of one pass: statuses sharing a retention share a cut (the usual
        case, one retention for all, is one cut), and each queue with rules of its own
        has its own cuts, the other cuts leaving it out."""
        longest = self.longest
        special = self.special_queues
        out = _grouped(
            now, {s: self.days(None, s) for s in FINAL_STATUSES}, longest, excluded=special
        )
        for queue in special:
            days = {s: self.days(queue, s) for s in FINAL_STATUSES}
            out += _grouped(now, days, longest, queues=(queue,))
        return out


def _grouped(
    now: datetime,
    days: dict[str, float],
    longest: float,
    *,
    queues: tuple[str, ...] | None = None,
    excluded: Iterable[str] = (),
) -> list[Cut]:
    by_days: dict[float, list[str]] = {}
    for status, value in days.items():
        by_days.setdefault(value, []).append(status)
    return [
        Cut(
            statuses=tuple(statuses),
            cutoff=now - timedelta(days=value),
            queues=queues,
            excluded=tuple(excluded),
            longest=value >= longest,
        )
        for value, statuses in sorted(by_days.items())
    ]


def current_retention(default_days: float | None = None) -> Retention:
    """The rules in force now: the knobs (``default_days`` for ``RETENTION_DAYS``, e.g. a
    reaper's flag) and the queues' retention set by operators."""
    from jobs.models import Queue

    operator = {}
    for name, value in Queue.objects.filter(retention_days__isnull=False).values_list(
        "name", "retention_days"
    ):
        try:
            checked = check_queue_retention(value)
        except RetentionError:
            continue  # edited by hand into something else: the settings' retention applies
        if checked:
            operator[name] = checked
    default = float(knob("RETENTION_DAYS")) if default_days is None else float(default_days)
    return Retention(
        default=default,
        statuses=status_retention(),
        configured=configured_queue_retention(),
        operator=operator,
    )


def parse_days(raw: str) -> float | None:
    """A retention typed into a form: blank clears it."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise RetentionError(DAYS_RULE) from None
    return check_days(value)
