"""How a job is retried (``RetryPolicy``): its backoff, which errors earn another attempt,
and how often it may ask to run later.

The one home of those decisions. A job's policy is layered, field by field,
the first layer that sets a field wins:

1. the job's own override, given at enqueue (``enqueue(..., retry={...})``,
   ``POST /jobs`` ``retry``) and stored on ``Job.retry_policy``: numbers and
   the strategy only, since exception classes live in code;
2. the operation's ``retry`` (``Operation.retry``, ``@operation(retry=...)``),
   with its ``retryable_exceptions`` joining ``retry_on``;
3. the worker's configured backoff (``RETRY_BACKOFF_SECONDS`` and
   ``RETRY_BACKOFF_MAX_SECONDS``, or the worker's flags), then the knobs
   ``RETRY_JITTER``, ``RETRY_STRATEGY``, ``RETRY_LATER_MAX`` and
   ``RETRY_LATER_MAX_SECONDS``.

Whether an error is retried: an exception in ``fail_on`` fails the job at
once, whatever else says so; then one in ``retry_on``, or one carrying
``retryable = True``, is retried while attempts remain.

The delay before attempt ``n + 1`` after attempt ``n`` failed is a step
(``exponential``: ``base * 2**(n-1)``; ``linear``: ``base * n``;
``constant``: ``base``), capped, then shortened by up to ``jitter`` of
itself at random: a delay lies in ``[step * (1 - jitter), step]``.

``RetryLaterError`` does not spend an attempt, so it has its own bound:
at most ``max_retry_later`` times per job (counted on ``Job.retry_laters``),
and, when ``retry_later_max_seconds`` is above 0, no later than that many
seconds after the job was enqueued. Past either the job fails with
``RetryLaterLimit``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

EXPONENTIAL = "exponential"
LINEAR = "linear"
CONSTANT = "constant"
STRATEGIES = (EXPONENTIAL, LINEAR, CONSTANT)

# The error code of a job failed for asking to run later too often or too long.
RETRY_LATER_LIMIT = "RetryLaterLimit"

# Bounds of what a policy (and a job's override) may say.
MAX_BACKOFF_SECONDS = 30 * 24 * 3600.0
MAX_RETRY_LATER = 1_000_000
MAX_RETRY_LATER_SECONDS = 365 * 24 * 3600.0

# The fields a job's override may set (numbers and the strategy), in the order errors name them.
OVERRIDE_FIELDS = (
    "backoff_seconds",
    "backoff_max_seconds",
    "jitter",
    "strategy",
    "max_retry_later",
    "retry_later_max_seconds",
)

RULES = {
    "backoff_seconds": (
        f"backoff_seconds must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:g}."
    ),
    "backoff_max_seconds": (
        f"backoff_max_seconds must be a number of seconds from 0 to {MAX_BACKOFF_SECONDS:g}."
    ),
    "jitter": "jitter must be a fraction from 0 to 1 (0.5: each delay is cut by up to half).",
    "strategy": f"strategy must be one of {', '.join(STRATEGIES)}.",
    "max_retry_later": f"max_retry_later must be a whole number from 0 to {MAX_RETRY_LATER:,}.",
    "retry_later_max_seconds": (
        "retry_later_max_seconds must be a number of seconds from 0 (no deadline) to "
        f"{MAX_RETRY_LATER_SECONDS:g}."
    ),
}


class RetryPolicyError(ValueError):
    """A policy field outside its rule; ``errors`` maps each field to its rule."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__(" ".join(errors.values()))


def _number(value: Any, low: float, high: float) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


def field_problems(values: dict[str, Any]) -> dict[str, str]:
    """The rule each of ``values``' policy fields breaks (``None`` means unset and passes)."""
    checks: dict[str, Callable[[Any], bool]] = {
        "backoff_seconds": lambda v: _number(v, 0, MAX_BACKOFF_SECONDS),
        "backoff_max_seconds": lambda v: _number(v, 0, MAX_BACKOFF_SECONDS),
        "jitter": lambda v: _number(v, 0, 1),
        "strategy": lambda v: v in STRATEGIES,
        "max_retry_later": lambda v: (
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_RETRY_LATER
        ),
        "retry_later_max_seconds": lambda v: _number(v, 0, MAX_RETRY_LATER_SECONDS),
    }
    return {
        name: RULES[name]
        for name, check in checks.items()
        if values.get(name) is not None and not check(values[name])
    }


def _classes(value: Any, name: str) -> tuple[type[BaseException], ...]:
    found = tuple(value) if isinstance(value, tuple | list) else (value,)
    if not all(isinstance(c, type) and issubclass(c, BaseException) for c in found):
        raise RetryPolicyError({name: f"{name} must be exception classes (a tuple of them)."})
    return found


@dataclass(frozen=True)
class RetryPolicy:
    """A retry policy; a field left ``None`` is taken from the layer below (module docstring)."""

    backoff_seconds: float | None = None
    backoff_max_seconds: float | None = None
    jitter: float | None = None
    strategy: str | None = None
    # Exceptions worth another attempt, and exceptions that fail the job at once (these win).
    retry_on: tuple[type[BaseException], ...] = ()
    fail_on: tuple[type[BaseException], ...] = ()
    max_retry_later: int | None = None
    retry_later_max_seconds: float | None = None

    def __post_init__(self) -> None:
        problems = field_problems({name: getattr(self, name) for name in OVERRIDE_FIELDS})
        if problems:
            raise RetryPolicyError(problems)
        object.__setattr__(self, "retry_on", _classes(self.retry_on, "retry_on"))
        object.__setattr__(self, "fail_on", _classes(self.fail_on, "fail_on"))

    def over(self, below: RetryPolicy) -> RetryPolicy:
        """This policy, with the fields it leaves unset taken from ``below``.

        ``retry_on`` and ``fail_on`` are joined; ``fail_on`` keeps winning.
        """
        values = {
            f.name: getattr(self, f.name)
            if getattr(self, f.name) is not None
            else getattr(below, f.name)
            for f in fields(self)
            if f.name in OVERRIDE_FIELDS
        }
        return RetryPolicy(
            **values,
            retry_on=_joined(self.retry_on, below.retry_on),
            fail_on=_joined(self.fail_on, below.fail_on),
        )

    def retrying(self, *exceptions: type[BaseException]) -> RetryPolicy:
        """This policy with ``exceptions`` added to ``retry_on``."""
        return replace(self, retry_on=_joined(self.retry_on, tuple(exceptions)))

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` earns another attempt (attempts permitting): ``fail_on`` wins."""
        if self.fail_on and isinstance(error, self.fail_on):
            return False
        if self.retry_on and isinstance(error, self.retry_on):
            return True
        return bool(getattr(error, "retryable", False))

    def step(self, attempt: int) -> float:
        """The delay after attempt ``attempt`` (from 1) failed, before jitter, capped."""
        base = float(_set(self.backoff_seconds, "backoff_seconds"))
        cap = float(_set(self.backoff_max_seconds, "backoff_max_seconds"))
        strategy = _set(self.strategy, "strategy")
        n = max(int(attempt), 1)
        if strategy == CONSTANT:
            raw = base
        elif strategy == LINEAR:
            raw = base * n
        else:  # exponential; past 2**1000 a float overflows, and the cap has long won
            raw = base * 2.0 ** min(n - 1, 1000)
        return min(cap, raw)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after attempt ``attempt`` failed: ``step``, less up to ``jitter``."""
        jitter = float(_set(self.jitter, "jitter"))
        step = self.step(attempt)
        return step * (1.0 - jitter * rand())

    def retry_later_refusal(self, snoozed: int, age_seconds: float) -> str | None:
        """Why a job that already ran later ``snoozed`` times, enqueued ``age_seconds`` ago,
        may not do so again (a sentence), or None."""
        limit = int(_set(self.max_retry_later, "max_retry_later"))
        if snoozed >= limit:
            return (
                f"The operation asked to run later {snoozed} times; the limit is {limit} "
                "(max_retry_later). Raise the limit in its retry policy, or let it fail or "
                "succeed sooner."
            )
        deadline = float(self.retry_later_max_seconds or 0.0)
        if deadline > 0 and age_seconds >= deadline:
            return (
                f"The operation asked to run later {age_seconds:.0f} s after the job was "
                f"enqueued; the limit is {deadline:g} s (retry_later_max_seconds)."
            )
        return None

    def override_json(self) -> dict[str, Any]:
        """The numeric fields this policy sets, as a job stores its override."""
        return {
            name: getattr(self, name) for name in OVERRIDE_FIELDS if getattr(self, name) is not None
        }


def _joined(
    first: tuple[type[BaseException], ...], second: tuple[type[BaseException], ...]
) -> tuple[type[BaseException], ...]:
    return first + tuple(c for c in second if c not in first)


def _set(value: Any, name: str) -> Any:
    if value is None:
        raise ValueError(f"The retry policy has no {name}; resolve it with resolved_policy().")
    return value


def global_policy() -> RetryPolicy:
    """The knobs' policy: the bottom layer of every job's."""
    from jobs.conf import knob

    return RetryPolicy(
        backoff_seconds=float(knob("RETRY_BACKOFF_SECONDS")),
        backoff_max_seconds=float(knob("RETRY_BACKOFF_MAX_SECONDS")),
        jitter=float(knob("RETRY_JITTER")),
        strategy=str(knob("RETRY_STRATEGY")),
        max_retry_later=int(knob("RETRY_LATER_MAX")),
        retry_later_max_seconds=float(knob("RETRY_LATER_MAX_SECONDS")),
    )


def resolved_policy(
    stored: dict[str, Any] | None,
    operation: RetryPolicy | None = None,
    worker: RetryPolicy | None = None,
) -> RetryPolicy:
    """A job's policy with every field set: its ``stored`` override over its ``operation``'s,
    over the ``worker``'s configured backoff, over the knobs."""
    policy = from_override(stored)
    for below in (operation, worker):
        if below is not None:
            policy = policy.over(below)
    return policy.over(global_policy())


def from_override(stored: dict[str, Any] | None) -> RetryPolicy:
    """A job's stored override as a policy; fields it does not know are ignored."""
    if not stored:
        return RetryPolicy()
    return RetryPolicy(**{k: v for k, v in stored.items() if k in OVERRIDE_FIELDS})


def check_override(value: Any) -> tuple[dict[str, Any] | None, dict[str, list[str]]]:
    """A job's ``retry`` override as given at enqueue: the dict to store, or errors by field.

    An object of ``OVERRIDE_FIELDS`` (``None`` values dropped; empty stores nothing).
    Exception classes cannot be given here: they are declared in code.
    """
    if value is None:
        return None, {}
    if not isinstance(value, dict):
        return None, {
            "retry": [
                f"retry must be an object with any of {', '.join(OVERRIDE_FIELDS)}.",
            ]
        }
    errors: dict[str, list[str]] = {}
    unknown = sorted(str(k) for k in value if k not in OVERRIDE_FIELDS)
    for name in unknown:
        extra = (
            " Exception classes are declared on the operation, in code."
            if name in ("retry_on", "fail_on")
            else ""
        )
        errors[f"retry.{name}"] = [
            f"retry takes {', '.join(OVERRIDE_FIELDS)}; {name!r} is not one of them.{extra}"
        ]
    given = {k: v for k, v in value.items() if k in OVERRIDE_FIELDS and v is not None}
    for name, rule in field_problems(given).items():
        errors[f"retry.{name}"] = [rule]
    if errors:
        return None, errors
    if "max_retry_later" in given:
        given["max_retry_later"] = int(given["max_retry_later"])
    for name in ("backoff_seconds", "backoff_max_seconds", "jitter", "retry_later_max_seconds"):
        if name in given:
            given[name] = float(given[name])
    return (given or None), {}


def stored_override(job_id: Any, *, using: str = "default") -> dict[str, Any] | None:
    """The job's stored override (``Job.retry_policy``), or None."""
    from jobs.models import Job

    return Job.objects.using(using).filter(pk=job_id).values_list("retry_policy", flat=True).first()
