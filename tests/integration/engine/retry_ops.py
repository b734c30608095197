"""Operations with retry policies of their own, loaded by worker subprocesses of these tests."""

from __future__ import annotations

from typing import Any

from jobs.exceptions import RetryLaterError
from jobs.operations import JobContext, Operation, RetryPolicy, operation, registry

MODULE = "tests.integration.engine.retry_ops"


class Flaky(Exception):
    """Retried by the policies below."""


class Broken(Flaky):
    """A Flaky that the class-declared policy fails at once (fail_on wins over retry_on)."""


@operation(
    "test.slow_backoff",
    max_attempts=2,
    retry=RetryPolicy(
        backoff_seconds=40.0, backoff_max_seconds=50.0, jitter=0.0, retry_on=(Flaky,)
    ),
)
def slow_backoff(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Always raises Flaky; its policy waits 40 s (no jitter) before the second attempt."""
    raise Flaky("flaky")


class Picky(Operation):
    """Declared as a class: Flaky retries, Broken (a Flaky) fails at once."""

    name = "test.picky"
    max_attempts = 3
    retry = RetryPolicy(
        backoff_seconds=0.05, strategy="constant", jitter=0.0, retry_on=(Flaky,), fail_on=(Broken,)
    )

    def execute(self, ctx: JobContext, payload: dict[str, Any]) -> None:
        raise Broken("broken") if payload.get("broken") else Flaky("flaky")


if Picky.name not in registry:
    registry.register(Picky)


@operation("test.snoozer", retry=RetryPolicy(max_retry_later=2))
def snoozer(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Asks to run later, every time: its policy allows two."""
    raise RetryLaterError("not yet", 0.01)
