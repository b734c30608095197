"""What a run may store (jobs.storable): progress, results, message caps."""

from __future__ import annotations

import datetime
import decimal
import uuid

import pytest

from jobs.exceptions import UnstorableValue
from jobs.storable import (
    PROGRESS_MAX,
    InvalidProgress,
    ResultTooLarge,
    cap_error_message,
    cap_event_message,
    checked_progress,
    progress_value,
    storable_json,
    truncated,
)


@pytest.mark.parametrize("value", [0, 7, PROGRESS_MAX, 5.0])
def test_whole_numbers_in_the_column_are_progress(value):
    assert progress_value(value) == int(value)


@pytest.mark.parametrize(
    "value", [-1, PROGRESS_MAX + 1, 10**12, float("nan"), float("inf"), 1.5, True, "3", None]
)
def test_anything_else_is_invalid_progress_naming_the_value(value):
    with pytest.raises(InvalidProgress) as refused:
        progress_value(value, "progress current")
    assert "progress current" in str(refused.value) and repr(value)[:3] in str(refused.value)


def test_a_current_above_its_total_is_clamped():
    assert checked_progress(15, 10) == (10, 10)
    assert checked_progress(3, None) == (3, None)
    assert checked_progress(None, 4) == (None, 4)


def test_documented_conversions_only():
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert storable_json(
        {"w": when, "d": when.date(), "t": when.time(), "u": uuid.UUID(int=1), "m": (1, 2)}
    ) == {
        "w": "2026-01-02T03:04:05+00:00",
        "d": "2026-01-02",
        "t": "03:04:05",
        "u": "00000000-0000-0000-0000-000000000001",
        "m": [1, 2],
    }
    assert storable_json({"a": decimal.Decimal("1.10")}) == {"a": "1.10"}
    for bad in ({1, 2}, object(), b"bytes", decimal.Decimal("NaN"), float("nan")):
        with pytest.raises(UnstorableValue):
            storable_json({"x": bad})


def test_a_result_past_the_cap_is_too_large_counting_utf8_bytes():
    assert storable_json("é" * 40, max_bytes=100) == "é" * 40  # 82 bytes of JSON
    with pytest.raises(ResultTooLarge, match="MAX_RESULT_BYTES"):
        storable_json("é" * 60, max_bytes=100)  # 122 bytes


def test_long_text_is_cut_once_with_a_marker(settings):
    assert truncated("abc", 5) == "abc"
    cut = truncated("x" * 50, 10)
    assert cut == "x" * 10 + "… [truncated: 40 of 50 characters not stored]"
    assert truncated(cut, 10) == cut  # an error message becoming its event's message
    settings.CONTROLPLANE = {"MAX_ERROR_MESSAGE_CHARS": 20, "MAX_EVENT_MESSAGE_CHARS": 30}
    assert cap_error_message("e" * 25).startswith("e" * 20 + "… [truncated: 5 of 25")
    assert cap_event_message("m" * 25) == "m" * 25
