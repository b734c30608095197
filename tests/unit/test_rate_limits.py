"""The rate limit's token bucket and the limits' rules, without a database."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from jobs.queue_limits import (
    LimitError,
    check_cap,
    check_rate,
    configured_queues,
    parse_rate,
)
from jobs.rate_limits import TokenWaits, burst, refill, seconds_until_token, take

T0 = datetime(2025, 3, 30, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- the bucket -------------------------------------------------------------------------


def test_burst_is_one_second_of_jobs_and_at_least_one():
    assert burst(5) == 5
    assert burst(0.2) == 1
    assert burst(1000) == 1000


def test_a_bucket_never_refilled_starts_full():
    assert refill(0.0, None, rate=5, now=T0) == (5.0, T0)


def test_refill_adds_elapsed_times_rate_up_to_the_burst():
    assert refill(0.0, T0, rate=5, now=at(0.2)) == (pytest.approx(1.0), at(0.2))
    assert refill(1.5, T0, rate=5, now=at(0.1)) == (pytest.approx(2.0), at(0.1))
    assert refill(0.0, T0, rate=5, now=at(60)) == (5.0, at(60))
    assert refill(0.0, T0, rate=0.5, now=at(60)) == (1.0, at(60))


def test_a_lowered_limit_caps_what_the_bucket_held():
    assert refill(100.0, T0, rate=2, now=at(0.1))[0] == 2.0


def test_a_clock_behind_the_stamp_adds_nothing_and_keeps_the_stamp():
    assert refill(0.4, at(1), rate=5, now=T0) == (0.4, at(1))
    assert refill(0.4, at(1), rate=5, now=at(1)) == (0.4, at(1))


def test_take_grants_whole_tokens_up_to_what_is_wanted():
    assert take(3.7, 10) == 3
    assert take(3.7, 2) == 2
    assert take(0.99, 4) == 0
    assert take(0.0, 4) == 0
    assert take(1 - 1e-12, 4) == 1  # a rounding error is not a missing token
    assert take(5.0, 0) == 0


def test_seconds_until_token():
    assert seconds_until_token(0.0, rate=5) == pytest.approx(0.2)
    assert seconds_until_token(0.75, rate=5) == pytest.approx(0.05)
    assert seconds_until_token(1.0, rate=5) == 0.0
    assert seconds_until_token(0.0, rate=0.1) == pytest.approx(10.0)


@given(
    rate=st.floats(min_value=0.1, max_value=500),
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=200),
    wants=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=200),
)
def test_claims_never_start_more_than_the_burst_plus_rate_times_elapsed(rate, gaps, wants):
    """Whatever the claims' timing and sizes: starts <= burst + rate x (last - first claim)."""
    tokens, stamp, now, started = 0.0, None, 0.0, 0
    for gap, wanted in zip(gaps, wants, strict=False):
        now += gap
        tokens, stamp = refill(tokens, stamp, rate=rate, now=at(now))
        granted = take(tokens, wanted)
        assert 0 <= granted <= wanted
        tokens = max(0.0, tokens - granted)
        assert 0.0 <= tokens <= burst(rate)
        started += granted
    assert started <= burst(rate) + rate * now + 1e-6


@given(rate=st.floats(min_value=0.5, max_value=200), seconds=st.integers(min_value=1, max_value=30))
def test_a_claimer_that_waits_for_each_token_starts_the_full_rate(rate, seconds):
    """No token is lost when claims come exactly when ``seconds_until_token`` says."""
    tokens, stamp, now, started = 0.0, at(0), 0.0, 0
    while True:
        tokens, stamp = refill(tokens, stamp, rate=rate, now=at(now))
        granted = take(tokens, 1000)
        tokens -= granted
        started += granted
        now += max(seconds_until_token(tokens, rate=rate), 1e-6)
        if now > seconds:
            break
    assert math.floor(rate * seconds) - 1 <= started <= math.floor(rate * seconds) + 1


# --- holding off until the next token -------------------------------------------------------


def test_token_waits_hold_a_queue_until_its_token_is_due():
    waits = TokenWaits()
    assert waits.ready("emails", rate=5) and waits.seconds_left(["emails"]) is None
    waits.hold("emails", rate=5, seconds=0.05)
    assert not waits.ready("emails", rate=5)
    assert waits.ready("other", rate=5)
    left = waits.seconds_left(["other", "emails"])
    assert left is not None and 0 < left <= 0.05
    time.sleep(0.06)
    assert waits.ready("emails", rate=5)
    assert waits.seconds_left(["emails"]) is None  # forgotten once ready


def test_a_changed_limit_ends_the_hold_at_once():
    waits = TokenWaits()
    waits.hold("emails", rate=0.01, seconds=100)
    assert not waits.ready("emails", rate=0.01)
    assert waits.ready("emails", rate=50)


# --- the rules ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 10, 100_000, None])
def test_caps_that_pass(value):
    assert check_cap(value) == value


@pytest.mark.parametrize("value", [0, -1, 100_001, 2.5, 5.0, True, "5", [5]])
def test_caps_that_do_not(value):
    with pytest.raises(LimitError, match="whole number from 1 to 100,000"):
        check_cap(value)


@pytest.mark.parametrize("value, rate", [(5, 5.0), (0.5, 0.5), (1_000_000, 1e6), (None, None)])
def test_rates_that_pass(value, rate):
    assert check_rate(value) == rate


@pytest.mark.parametrize(
    "value", [0, -1, 0.0, 1_000_001, math.inf, -math.inf, math.nan, True, "5", {}]
)
def test_rates_that_do_not(value):
    with pytest.raises(LimitError, match="above 0"):
        check_rate(value)


def test_a_form_rate_is_parsed_and_blank_clears_it():
    assert parse_rate(" 2.5 ") == 2.5
    assert parse_rate("") is None
    for bad in ("abc", "nan", "inf", "0", "-3"):
        with pytest.raises(LimitError):
            parse_rate(bad)


# --- CONTROLPLANE["QUEUES"] ----------------------------------------------------------------


def test_configured_queues_are_checked_and_normalised(settings, monkeypatch):
    monkeypatch.delenv("CONTROLPLANE_QUEUES", raising=False)
    settings.CONTROLPLANE = {
        "QUEUES": {"emails": {"rate_limit_per_second": 5, "concurrency_cap": 10}, "x": {}}
    }
    assert configured_queues() == {
        "emails": {"rate_limit_per_second": 5.0, "concurrency_cap": 10},
        "x": {},
    }
    monkeypatch.setenv("CONTROLPLANE_QUEUES", '{"sms": {"rate_limit_per_second": null}}')
    assert configured_queues() == {"sms": {"rate_limit_per_second": None}}


@pytest.mark.parametrize(
    "queues, says",
    [
        ([], "must map queue names"),
        ({"emails": 5}, "must be a dict of limits"),
        ({"emails": {"rate": 5}}, "names rate; a queue takes"),
        ({"emails": {"rate_limit_per_second": -1}}, "above 0"),
        ({"emails": {"concurrency_cap": 0}}, "whole number"),
        ({"": {}}, "is not a queue name"),
    ],
)
def test_misconfigured_queues_say_what_is_wrong(settings, monkeypatch, queues, says):
    monkeypatch.delenv("CONTROLPLANE_QUEUES", raising=False)
    settings.CONTROLPLANE = {"QUEUES": queues}
    with pytest.raises(ImproperlyConfigured, match=says):
        configured_queues()


def test_a_queues_variable_that_is_not_json_is_refused(monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_QUEUES", "emails=5")
    with pytest.raises(ImproperlyConfigured, match="JSON object"):
        configured_queues()
