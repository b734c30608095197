"""How a key's standing reads (jobs.selectors.flow_keys.KeyState) and the queues page's key
limits form (dashboard.key_limit_form), without a database."""

from __future__ import annotations

import pytest

from dashboard.key_limit_form import describe, read_limits
from jobs.key_limits import RULES, KeyLimitError, Limits
from jobs.selectors.flow_keys import KeyState


def test_a_key_at_its_concurrency_limit():
    state = KeyState("account:42", Limits(concurrency=2), running=2)
    assert state.at_limit and state.holding and not state.out_of_tokens
    assert state.reasons() == ["at its limit 2/2"]
    assert not KeyState("account:42", Limits(concurrency=2), running=1).holding


def test_a_key_out_of_tokens_names_its_rate():
    state = KeyState("api:7", Limits(rate=10), tokens=0.4)
    assert state.out_of_tokens and not state.at_limit
    assert state.reasons() == ["out of tokens (10/s)"]
    assert state.reasons(rate_word="rate ") == ["out of tokens (rate 10/s)"]
    assert not KeyState("api:7", Limits(rate=10), tokens=0.9999999999).holding  # rounding


def test_both_limits_at_once():
    state = KeyState("k", Limits(concurrency=1, rate=0.5), running=1, tokens=0.0)
    assert state.reasons() == ["at its limit 1/1", "out of tokens (0.5/s)"]


def test_the_form_reads_numbers_and_blank_clears():
    form = {"concurrency": "3", "rate": " 2.5 ", "burst": "", "weight": "2"}
    assert read_limits(form) == {"concurrency": 3, "rate": 2.5, "burst": None, "weight": 2.0}
    assert read_limits({}) == {"concurrency": None, "rate": None, "burst": None, "weight": None}


def test_text_that_is_not_a_number_gets_the_fields_rule():
    with pytest.raises(KeyLimitError) as error:
        read_limits({"concurrency": "2.5", "rate": "fast", "weight": "1"})
    assert error.value.errors == {
        "concurrency": [RULES["concurrency"]],
        "rate": [RULES["rate"]],
    }


@pytest.mark.parametrize(
    ("values", "text"),
    [
        (
            {"concurrency": 2, "rate": 10.0, "burst": 20.0, "weight": 1.0},
            "concurrency 2, rate 10/s, burst 20",
        ),
        ({"weight": 3.0}, "weight 3"),
        ({"concurrency": None, "rate": None}, "no limits"),
    ],
)
def test_describe(values, text):
    assert describe(values) == text
