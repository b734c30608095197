"""Flow key limits: their rules, where they come from, and the cached view claims read.

A limit row (``KeyLimit``) is named after a family (``account``) or one key
(``account:42``); a key obeys its own row if it has one, else its family's
(``limits_for``). The fields: ``concurrency`` (1 to ``MAX_CONCURRENCY``
jobs running at once), ``rate`` (tokens per second, above 0, at most
``MAX_RATE``), ``burst`` (the bucket's size, at least 1; default
``max(1, rate)``) and ``weight`` (fair dispatch turns, 0.01 to 100).

Where they come from, in order of precedence:

- an operator's change (``PATCH /keys/<name>``, the queues page), audited
  as ``set_key_limits`` (``jobs.operator_actions.set_key_limits``);
- code: ``Key(..., concurrency=2)`` on an operation, or
  ``CONTROLPLANE["KEYS"] = {"account": {"concurrency": 2}}``. Workers apply
  these when they start, and only when a family's declaration differs from
  the one last applied (audited as ``key_settings`` by ``settings``), so an
  operator's change stands until a deploy changes that declaration. An
  enqueue that meets a family with no row yet creates it from the
  declaration, so the first job is already limited.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobs.conf import json_knob, knob
from jobs.flow_keys import Key, declared_keys, family, key_problem
from jobs.models import KeyLimit

log = logging.getLogger("jobs")

MAX_CONCURRENCY = 100_000
MAX_RATE = 1_000_000.0
MIN_WEIGHT, MAX_WEIGHT = 0.01, 100.0
FIELDS = ("concurrency", "rate", "burst", "weight")

RULES = {
    "concurrency": f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,}, or null.",
    "rate": f"rate must be a number of jobs per second above 0 and at most {MAX_RATE:,.0f}, "
    "or null.",
    "burst": f"burst must be a number from 1 to {MAX_RATE:,.0f}, or null (one second's worth).",
    "weight": f"weight must be a number from {MIN_WEIGHT} to {MAX_WEIGHT:g}.",
}


class KeyLimitError(ValueError):
    """Limits outside their rules; ``errors`` maps each field to its rule."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(m for ms in errors.values() for m in ms))
        self.errors = errors


@dataclass(frozen=True)
class Limits:
    """What a claim needs of one key's limits."""

    concurrency: int | None = None
    rate: float | None = None
    burst: float | None = None
    weight: float = 1.0

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    @property
    def bucket(self) -> float:
        """The most tokens the key's bucket holds."""
        return self.burst if self.burst is not None else max(1.0, self.rate or 0.0)


UNLIMITED = Limits()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def check_limits(values: Mapping[str, Any], *, partial: bool = True) -> dict[str, Any]:
    """``values`` checked against the rules; ``KeyLimitError`` names every field in error.

    Unknown fields are errors too. ``None`` clears a field (weight: back to 1).
    """
    errors: dict[str, list[str]] = {}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in FIELDS:
            errors[name] = [f"Unknown field; a key's limits are {', '.join(FIELDS)}."]
            continue
        if value is None:
            out[name] = 1.0 if name == "weight" else None
            continue
        number = _number(value)
        if name == "concurrency":
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and 1 <= value <= MAX_CONCURRENCY
            out[name] = value
        elif name == "rate":
            ok = number is not None and 0 < number <= MAX_RATE
            out[name] = number
        elif name == "burst":
            ok = number is not None and 1 <= number <= MAX_RATE
            out[name] = number
        else:
            ok = number is not None and MIN_WEIGHT <= number <= MAX_WEIGHT
            out[name] = number
        if not ok:
            errors[name] = [RULES[name]]
    if not values and not partial:
        errors["limits"] = [f"Give at least one of {', '.join(FIELDS)}."]
    if errors:
        raise KeyLimitError(errors)
    return out


def check_name(name: Any) -> str:
    """A limit row's name: a family (``account``) or a key (``account:42``)."""
    problem = key_problem(name)
    if problem:
        raise KeyLimitError({"name": [f"The key {problem}."]})
    return name


# --- the cached view --------------------------------------------------------------


class _LimitCache:
    """Every ``KeyLimit`` row, read at most once per ``QUEUE_SETTINGS_CACHE_SECONDS``.

    Claims read limits for every keyed claim; the table is small (families,
    and the few keys an operator set on their own), so the whole of it is
    cached, and a change is seen within a second, as queue settings are.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._rows: dict[str, Limits] = {}

    def rows(self, using: str = "default") -> dict[str, Limits]:
        ttl = float(knob("QUEUE_SETTINGS_CACHE_SECONDS"))
        with self._lock:
            if time.monotonic() - self._read_at < ttl:
                return self._rows
        rows = {
            r.name: Limits(r.concurrency, r.rate, r.burst, r.weight)
            for r in KeyLimit.objects.using(using).all()
        }
        with self._lock:
            self._rows, self._read_at = rows, time.monotonic()
        return rows

    def forget(self) -> None:
        with self._lock:
            self._read_at = -math.inf


cache = _LimitCache()


def limits_for(key: str, rows: Mapping[str, Limits]) -> Limits:
    """The limits ``key`` obeys: its own row, else its family's, else none."""
    return rows.get(key) or rows.get(family(key)) or UNLIMITED


# --- declared in code ---------------------------------------------------------------


def declared_limits() -> dict[str, dict[str, Any]]:
    """Every family's limits as code declares them: the operations' keys, then ``KEYS``.

    Two operations declaring the same family must agree; ``ImproperlyConfigured`` else.
    """
    from jobs.operations import registry

    declared: dict[str, dict[str, Any]] = {}
    owners: dict[str, str] = {}
    for op in registry.all():
        for key in declared_keys(op):
            limits = key.limits()
            if not limits:
                continue
            if key.family in declared and declared[key.family] != limits:
                raise ImproperlyConfigured(
                    f"The operations {owners[key.family]!r} and {op.name!r} declare different "
                    f"limits for the key family {key.family!r}: "
                    f"{declared[key.family]} and {limits}."
                )
            declared[key.family], owners[key.family] = limits, op.name
    declared.update(configured_keys())
    return declared


def configured_keys() -> dict[str, dict[str, Any]]:
    """``CONTROLPLANE["KEYS"]`` (or ``CONTROLPLANE_KEYS`` as JSON), checked."""
    raw = json_knob("KEYS")
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            'CONTROLPLANE["KEYS"] must map key families to their limits, e.g. '
            '{"account": {"concurrency": 2}}.'
        )
    out = {}
    for name, entry in raw.items():
        if key_problem(name) or not isinstance(entry, dict):
            raise ImproperlyConfigured(
                f'CONTROLPLANE["KEYS"]: {name!r} must name a key family and map it to its '
                f"limits ({', '.join(FIELDS)})."
            )
        try:
            out[name] = check_limits(entry)
        except KeyLimitError as error:
            raise ImproperlyConfigured(f'CONTROLPLANE["KEYS"]["{name}"]: {error}') from None
    return out


def apply_declared_limits() -> list[str]:
    """Write each family's declared limits whose declaration changed since last applied.

    Under the row's lock, so processes starting together apply a declaration
    once; each application is an audit row (``key_settings``, by ``settings``)
    that the next start compares against.
    """
    declared = declared_limits()
    if not declared:
        return []
    from jobs import audit

    applied = []
    for name, wanted in declared.items():
        if not audit.apply_declared(KeyLimit, name, wanted, action=audit.APPLY_KEY_SETTINGS):
            continue
        applied.append(name)
        log.info("key.settings_applied key=%s %s", name, json.dumps(wanted, sort_keys=True))
    cache.forget()
    return applied


_known_families: set[str] = set()
_known_lock = threading.Lock()


def forget() -> None:
    """Forget the cached limits and the families known to have rows (tests, a reset)."""
    cache.forget()
    with _known_lock:
        _known_families.clear()


def ensure_declared(keys: Iterable[Key], using: str = "default") -> None:
    """Create the limit rows of declared families that have none yet (once per process).

    So the first job of a new family is limited before any worker restarts;
    an existing row (an operator's or an earlier start's) is left alone.
    """
    wanted = {}
    for key in keys:
        limits = key.limits()
        if limits and key.family not in _known_families:
            wanted[key.family] = limits
    if not wanted:
        return
    existing = set(
        KeyLimit.objects.using(using).filter(name__in=wanted).values_list("name", flat=True)
    )
    missing = [KeyLimit(name=n, **v) for n, v in wanted.items() if n not in existing]
    if missing:
        KeyLimit.objects.using(using).bulk_create(missing, ignore_conflicts=True)
        cache.forget()
    with _known_lock:
        _known_families.update(wanted)
