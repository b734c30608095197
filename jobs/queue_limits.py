"""A queue's two limits, the concurrency cap and the rate limit: their rules and their settings.

An operator sets them, and a queue's retention, through ``jobs.operator_actions``.

One set of rules for every way in (``PATCH /queues/<name>``, the queues
page, ``CONTROLPLANE["QUEUES"]``): a cap is a whole number from 1 to
``MAX_CAP``, a rate a finite number of jobs per second above 0 and at most
``MAX_RATE``; ``None`` clears either.

Settings declare limits next to the code that needs them::

    CONTROLPLANE = {"QUEUES": {"emails": {"rate_limit_per_second": 5, "concurrency_cap": 10}}}

Workers and reapers apply them when they start (``apply_configured_queues``),
and only when a queue's entry differs from the one last applied (recorded
in the audit log as ``queue_settings``, by ``settings``). So an operator's
change from the dashboard or the API stands until a deploy changes that
queue's entry; restarting a worker does not undo it. A field or a queue no
longer named keeps its current value: set it to ``None`` to clear it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured

from jobs.conf import json_knob
from jobs.models import Queue, QueueKind

log = logging.getLogger("jobs")

MAX_CAP = 100_000
MAX_RATE = 1_000_000.0
FIELDS = ("concurrency_cap", "rate_limit_per_second")

CAP_RULE = f"The concurrency cap must be a whole number from 1 to {MAX_CAP:,}, or null for none."
RATE_RULE = (
    f"The rate limit must be a number of jobs per second above 0 and at most {MAX_RATE:,.0f}, "
    "or null for none."
)


class QueueSettings(NamedTuple):
    """What a worker's claim reads of a queue: paused, its limits and its kind."""

    paused: bool
    cap: int | None  # most jobs running at once across all workers; None: no cap
    kind: str  # QueueKind: jobs, or batch messages
    rate: float | None  # most jobs started per second across all workers; None: no limit
    keyed: bool = False  # holds jobs with flow keys, claimed by jobs.keyed_claims as well

    @property
    def unlimited_jobs(self) -> bool:
        """A job queue with neither a cap nor a rate limit: claimed with the others at once."""
        return self.kind == QueueKind.JOB and self.cap is None and self.rate is None

    @property
    def plain_jobs(self) -> bool:
        """An unlimited job queue without keyed jobs: the one statement serves it whole."""
        return self.unlimited_jobs and not self.keyed


def queue_settings(names: Sequence[str]) -> dict[str, QueueSettings]:
    """The settings of each queue in ``names``; a queue without a row has the defaults."""
    rows = {
        q.name: QueueSettings(q.paused, q.concurrency_cap, q.kind, q.rate_limit_per_second, q.keyed)
        for q in Queue.objects.filter(name__in=names)
    }
    return {
        name: rows.get(name) or QueueSettings(False, None, Queue.default_kind(name), None)
        for name in names
    }


class LimitError(ValueError):
    """A limit outside its rule; ``str()`` is the rule, a sentence to show as it is."""


def check_cap(value: Any) -> int | None:
    """A concurrency cap as given in JSON or settings (``None`` clears it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CAP:
        raise LimitError(CAP_RULE)
    return value


def check_rate(value: Any) -> float | None:
    """A rate limit in jobs per second as given in JSON or settings (``None`` clears it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LimitError(RATE_RULE)
    try:
        rate = float(value)
    except OverflowError:  # a JSON integer of hundreds of digits
        raise LimitError(RATE_RULE) from None
    if not math.isfinite(rate) or not 0 < rate <= MAX_RATE:
        raise LimitError(RATE_RULE)
    return rate


def parse_rate(raw: str) -> float | None:
    """A rate limit typed into a form: blank clears it."""
    raw = (raw or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise LimitError(RATE_RULE) from None
    return check_rate(value)


CHECKS = {"concurrency_cap": check_cap, "rate_limit_per_second": check_rate}


# --- from settings -------------------------------------------------------------------


def configured_queues() -> dict[str, dict[str, Any]]:
    """``CONTROLPLANE["QUEUES"]`` (or ``CONTROLPLANE_QUEUES`` as JSON), checked and normalised."""
    raw = json_knob("QUEUES")
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            'CONTROLPLANE["QUEUES"] must map queue names to their limits, e.g. '
            '{"emails": {"rate_limit_per_second": 5, "concurrency_cap": 10}}.'
        )
    queues: dict[str, dict[str, Any]] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise ImproperlyConfigured(
                f'CONTROLPLANE["QUEUES"]: {name!r} is not a queue name (1 to 200 characters).'
            )
        if not isinstance(entry, dict):
            raise ImproperlyConfigured(
                f'CONTROLPLANE["QUEUES"]["{name}"] must be a dict of limits ({", ".join(FIELDS)}).'
            )
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise ImproperlyConfigured(
                f'CONTROLPLANE["QUEUES"]["{name}"] names {", ".join(map(str, unknown))}; '
                f"a queue takes {', '.join(FIELDS)}."
            )
        try:
            queues[name] = {field: CHECKS[field](value) for field, value in entry.items()}
        except LimitError as error:
            raise ImproperlyConfigured(f'CONTROLPLANE["QUEUES"]["{name}"]: {error}') from None
    return queues


def apply_configured_queues() -> list[str]:
    """Write each configured queue's limits whose entry changed since last applied; return them.

    Under the queue row's lock, so processes starting together apply an
    entry once. Each application is an audit row (``queue_settings``, by
    ``settings``) that the next start compares against.
    """
    configured = configured_queues()
    if not configured:  # most deployments: the audit log (with the auth views) stays unloaded
        return []
    from jobs import audit

    applied = []
    for name, wanted in configured.items():
        kind = {"kind": Queue.default_kind(name)}
        if not audit.apply_declared(
            Queue, name, wanted, action=audit.APPLY_SETTINGS, defaults=kind
        ):
            continue
        applied.append(name)
        log.info("queue.settings_applied queue=%s %s", name, json.dumps(wanted, sort_keys=True))
    return applied
