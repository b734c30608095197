"""The retry policy's math and precedence (jobs.retry_policy), without a database."""

from __future__ import annotations

import pytest
from django.test import override_settings

from jobs.retry_policy import (
    RetryPolicy,
    RetryPolicyError,
    check_override,
    resolved_policy,
)


class Transient(Exception):
    pass


class Fatal(Transient):
    pass


def policy(**fields) -> RetryPolicy:
    return RetryPolicy(**{"backoff_seconds": 2.0, "backoff_max_seconds": 1000.0, **fields})


@pytest.mark.parametrize(
    ("strategy", "steps"),
    [
        ("exponential", [2, 4, 8, 16, 32]),
        ("linear", [2, 4, 6, 8, 10]),
        ("constant", [2, 2, 2, 2, 2]),
    ],
)
def test_each_strategy_grows_its_own_way(strategy, steps):
    p = policy(strategy=strategy, jitter=0.0)
    assert [p.step(n) for n in range(1, 6)] == steps
    assert [p.delay(n) for n in range(1, 6)] == steps  # no jitter: the step exactly


def test_the_cap_bounds_every_strategy_even_at_huge_attempts():
    for strategy in ("exponential", "linear", "constant"):
        p = policy(strategy=strategy, jitter=0.0, backoff_seconds=8.0, backoff_max_seconds=7.0)
        assert p.step(1) == 7.0 and p.step(10**6) == 7.0
        assert p.delay(10**6) == 7.0
    assert (
        policy(strategy="exponential", backoff_seconds=1.0, backoff_max_seconds=7.0).step(4) == 7.0
    )


@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.5, 1.0])
def test_jitter_takes_off_at_most_its_fraction(jitter):
    p = policy(strategy="constant", jitter=jitter, backoff_seconds=10.0)
    assert p.delay(1, rand=lambda: 0.0) == 10.0
    assert p.delay(1, rand=lambda: 1.0) == pytest.approx(10.0 * (1 - jitter))
    for _ in range(200):
        assert 10.0 * (1 - jitter) <= p.delay(1) <= 10.0


def test_fail_on_wins_over_retry_on_and_over_the_errors_own_word():
    p = RetryPolicy(retry_on=(Transient,), fail_on=(Fatal,))
    assert p.retries(Transient())
    assert not p.retries(Fatal())  # a Transient too, but fail_on wins
    error = Fatal()
    error.retryable = True
    assert not p.retries(error)
    other = ValueError()
    assert not p.retries(other)
    other.retryable = True
    assert p.retries(other)


def test_layers_fill_field_by_field_and_join_the_exception_lists():
    job = RetryPolicy(backoff_seconds=30.0)
    operation = RetryPolicy(backoff_seconds=5.0, jitter=0.0, retry_on=(Transient,))
    worker = RetryPolicy(backoff_seconds=1.0, backoff_max_seconds=60.0, fail_on=(Fatal,))
    merged = job.over(operation).over(worker)
    assert (merged.backoff_seconds, merged.jitter, merged.backoff_max_seconds) == (30.0, 0.0, 60.0)
    assert merged.retry_on == (Transient,) and merged.fail_on == (Fatal,)


@override_settings(
    CONTROLPLANE={
        "RETRY_BACKOFF_SECONDS": 3,
        "RETRY_JITTER": 0.1,
        "RETRY_STRATEGY": "linear",
        "RETRY_LATER_MAX": 7,
    }
)
def test_the_knobs_are_the_bottom_layer():
    resolved = resolved_policy({"backoff_seconds": 9}, RetryPolicy(jitter=0.0))
    assert resolved.backoff_seconds == 9.0  # the job's override
    assert resolved.jitter == 0.0  # the operation's
    assert resolved.strategy == "linear" and resolved.max_retry_later == 7  # the knobs'
    assert resolved_policy(None).backoff_seconds == 3.0


def test_retry_later_bound_by_count_and_by_deadline():
    p = RetryPolicy(max_retry_later=3, retry_later_max_seconds=60.0)
    assert p.retry_later_refusal(2, 10.0) is None
    refusal = p.retry_later_refusal(3, 10.0)
    assert refusal and "3 times; the limit is 3 (max_retry_later)" in refusal
    late = p.retry_later_refusal(0, 61.0)
    assert late and "retry_later_max_seconds" in late
    assert RetryPolicy(max_retry_later=5).retry_later_refusal(1, 10**9) is None  # no deadline


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"backoff_seconds": -1}, "backoff_seconds"),
        ({"backoff_max_seconds": float("inf")}, "backoff_max_seconds"),
        ({"jitter": 1.5}, "jitter"),
        ({"strategy": "fibonacci"}, "strategy"),
        ({"max_retry_later": 2.5}, "max_retry_later"),
        ({"max_retry_later": True}, "max_retry_later"),
    ],
)
def test_a_policy_outside_its_rules_is_refused_with_the_rule(fields, bad):
    with pytest.raises(RetryPolicyError) as caught:
        RetryPolicy(**fields)
    assert bad in caught.value.errors
    assert check_override(fields) == (None, {f"retry.{bad}": [caught.value.errors[bad]]})


def test_exception_lists_must_hold_exception_classes():
    with pytest.raises(RetryPolicyError, match="exception classes"):
        RetryPolicy(retry_on=("ValueError",))


def test_an_override_keeps_numbers_only():
    stored, errors = check_override({"backoff_seconds": 5, "strategy": "constant"})
    assert errors == {} and stored == {"backoff_seconds": 5.0, "strategy": "constant"}
    assert check_override({}) == (None, {})
    _, errors = check_override({"retry_on": ["ValueError"]})
    assert "declared on the operation" in errors["retry.retry_on"][0]
    _, errors = check_override([1, 2])
    assert list(errors) == ["retry"]
