"""Schedule timing without a database: cron (5 and 6 fields), intervals, time zones, DST.

The DST rule (jobs.schedules.timing): a skipped wall-clock time fires once at
the first instant after the gap; a repeated one fires once, at its first
occurrence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jobs.schedules.timing import (
    Timing,
    TimingError,
    check_every_seconds,
    normalise_cron,
    wall_to_instant,
    zone,
)

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def local(instant: datetime, name: str) -> str:
    return instant.astimezone(ZoneInfo(name)).strftime("%Y-%m-%d %H:%M:%S%z")


def fires(timing: Timing, start: datetime, end: datetime) -> list[datetime]:
    """Every fire time in [start, end), by stepping ``next_after``."""
    out, at = [], start - timedelta(microseconds=1)
    while True:
        at = timing.next_after(at)
        if at is None or at >= end:
            return out
        out.append(at)


def day(name: str, year: int, month: int, date: int) -> tuple[datetime, datetime]:
    """The local calendar day as a UTC interval (23, 24 or 25 hours long)."""
    tz = ZoneInfo(name)
    start = datetime(year, month, date, tzinfo=tz).astimezone(UTC)
    end = (datetime(year, month, date, tzinfo=tz) + timedelta(days=1)).astimezone(UTC)
    return start, end


# --- spring forward: the skipped time fires once, right after the gap --------------


@pytest.mark.parametrize(
    ("name", "date", "expected"),
    [
        # Berlin 2025-03-30: 02:00 CET -> 03:00 CEST (01:00 UTC).
        (BERLIN, (2025, 3, 30), "2025-03-30 03:00:00+0200"),
        # New York 2025-03-09: 02:00 EST -> 03:00 EDT (07:00 UTC).
        (NEW_YORK, (2025, 3, 9), "2025-03-09 03:00:00-0400"),
    ],
)
def test_a_skipped_time_fires_once_at_the_end_of_the_gap(name, date, expected):
    timing = Timing(cron="30 2 * * *", timezone=name)
    start, end = day(name, *date)
    on_the_day = fires(timing, start, end)
    assert [local(t, name) for t in on_the_day] == [expected]
    # The days around it fire at 02:30 as usual.
    before = fires(timing, start - timedelta(days=1), start)
    after = fires(timing, end, end + timedelta(days=1))
    assert [local(t, name)[11:16] for t in before + after] == ["02:30", "02:30"]


def test_skipped_times_of_a_frequent_expression_share_one_fire_after_the_gap():
    timing = Timing(cron="*/15 * * * *", timezone=BERLIN)
    got = fires(timing, utc(2025, 3, 30, 0, 30), utc(2025, 3, 30, 1, 20))
    assert [local(t, BERLIN)[11:16] for t in got] == ["01:30", "01:45", "03:00", "03:15"]
    # slots() (the catch-up walk, backwards) agrees, without a duplicate at 03:00.
    slots = timing.slots(utc(2025, 3, 30, 0, 30), utc(2025, 3, 30, 1, 15), newest=10)
    assert slots == got


def test_a_gap_of_half_an_hour_lord_howe():
    # Australia/Lord_Howe 2025-10-05: 02:00 -> 02:30 (+10:30 -> +11:00).
    name = "Australia/Lord_Howe"
    timing = Timing(cron="15 2 * * *", timezone=name)
    assert [local(t, name) for t in fires(timing, *day(name, 2025, 10, 5))] == [
        "2025-10-05 02:30:00+1100"
    ]


# --- fall back: the repeated time fires once, at its first occurrence --------------


@pytest.mark.parametrize(
    ("name", "date", "cron", "expected"),
    [
        # Berlin 2025-10-26: 03:00 CEST -> 02:00 CET; 02:30 happens twice.
        (BERLIN, (2025, 10, 26), "30 2 * * *", "2025-10-26 02:30:00+0200"),
        # New York 2025-11-02: 02:00 EDT -> 01:00 EST; 01:30 happens twice.
        (NEW_YORK, (2025, 11, 2), "30 1 * * *", "2025-11-02 01:30:00-0400"),
    ],
)
def test_a_repeated_time_fires_once_at_its_first_occurrence(name, date, cron, expected):
    timing = Timing(cron=cron, timezone=name)
    assert [local(t, name) for t in fires(timing, *day(name, *date))] == [expected]


def test_a_frequent_expression_does_not_fire_again_in_the_repeated_hour():
    timing = Timing(cron="*/30 * * * *", timezone=NEW_YORK)
    got = fires(timing, utc(2025, 11, 2, 4, 0), utc(2025, 11, 2, 7, 1))
    assert [local(t, NEW_YORK) for t in got] == [
        "2025-11-02 00:00:00-0400",
        "2025-11-02 00:30:00-0400",
        "2025-11-02 01:00:00-0400",
        "2025-11-02 01:30:00-0400",
        # 01:00 and 01:30 EST (the second pass) do not fire again.
        "2025-11-02 02:00:00-0500",
    ]
    assert timing.slots(utc(2025, 11, 2, 4, 0), utc(2025, 11, 2, 7, 0), newest=10) == got


def test_next_after_an_instant_inside_the_repeated_hour():
    timing = Timing(cron="*/30 * * * *", timezone=NEW_YORK)
    # 06:10 UTC is 01:10 EST, the second pass of 01:xx.
    assert local(timing.next_after(utc(2025, 11, 2, 6, 10)), NEW_YORK) == (
        "2025-11-02 02:00:00-0500"
    )


def test_wall_to_instant_for_ordinary_repeated_and_skipped_times():
    berlin = ZoneInfo(BERLIN)
    assert wall_to_instant(datetime(2025, 6, 1, 12, 0), berlin) == utc(2025, 6, 1, 10, 0)
    assert wall_to_instant(datetime(2025, 10, 26, 2, 30), berlin) == utc(2025, 10, 26, 0, 30)
    assert wall_to_instant(datetime(2025, 3, 30, 2, 30), berlin) == utc(2025, 3, 30, 1, 0)
    assert wall_to_instant(datetime(2025, 3, 30, 2, 0), berlin) == utc(2025, 3, 30, 1, 0)


# --- the seconds field -----------------------------------------------------------------


def test_six_fields_put_the_seconds_first():
    every_ten = Timing(cron="*/10 * * * * *")
    assert every_ten.next_after(utc(2025, 1, 1, 12, 0, 3)) == utc(2025, 1, 1, 12, 0, 10)
    assert every_ten.next_after(utc(2025, 1, 1, 12, 0, 10)) == utc(2025, 1, 1, 12, 0, 20)
    daily = Timing(cron="30 0 9 * * *", timezone=BERLIN)  # 09:00:30 Berlin
    assert local(daily.next_after(utc(2025, 1, 1)), BERLIN) == "2025-01-01 09:00:30+0100"
    every_second = Timing(cron="* * * * * *")
    assert every_second.slots(utc(2025, 1, 1), utc(2025, 1, 1, 0, 0, 59), newest=3) == [
        utc(2025, 1, 1, 0, 0, 57),
        utc(2025, 1, 1, 0, 0, 58),
        utc(2025, 1, 1, 0, 0, 59),
    ]


def test_five_fields_fire_on_whole_minutes():
    timing = Timing(cron="*/5 * * * *")
    assert timing.next_after(utc(2025, 1, 1, 12, 0, 0)) == utc(2025, 1, 1, 12, 5)
    assert timing.next_after(utc(2025, 1, 1, 12, 4, 59, 999999)) == utc(2025, 1, 1, 12, 5)


def test_a_seconds_expression_crosses_a_gap_with_one_fire():
    timing = Timing(cron="*/20 * * * * *", timezone=BERLIN)
    got = fires(timing, utc(2025, 3, 30, 0, 59, 30), utc(2025, 3, 30, 1, 0, 30))
    assert [local(t, BERLIN)[11:19] for t in got] == ["01:59:40", "03:00:00", "03:00:20"]


# --- every_seconds ---------------------------------------------------------------------


def test_intervals_are_aligned_to_the_epoch():
    minute = Timing(every_seconds=60)
    assert minute.next_after(utc(2025, 1, 1, 12, 0, 1)) == utc(2025, 1, 1, 12, 1)
    assert minute.next_after(utc(2025, 1, 1, 12, 1)) == utc(2025, 1, 1, 12, 2)
    half = Timing(every_seconds=1.5)
    assert half.next_after(utc(2025, 1, 1)) == utc(2025, 1, 1, 0, 0, 1) + timedelta(
        microseconds=500_000
    )


def test_intervals_ignore_dst():
    hourly = Timing(every_seconds=3600, timezone=BERLIN)
    assert len(fires(hourly, *day(BERLIN, 2025, 3, 30))) == 23
    assert len(fires(hourly, *day(BERLIN, 2025, 10, 26))) == 25


def test_slots_keep_the_newest_and_include_both_ends():
    timing = Timing(every_seconds=10)
    start, end = utc(2025, 1, 1, 0, 0, 0), utc(2025, 1, 1, 0, 1, 0)
    assert len(timing.slots(start, end, newest=100)) == 7
    assert timing.slots(start, end, newest=2) == [utc(2025, 1, 1, 0, 0, 50), end]
    assert timing.slots(end, start, newest=5) == []
    cron = Timing(cron="* * * * *")
    assert cron.slots(utc(2025, 1, 1, 0, 0), utc(2025, 1, 1, 0, 3), newest=100) == [
        utc(2025, 1, 1, 0, m) for m in range(4)
    ]


# --- validation ------------------------------------------------------------------------


def test_cron_expressions_are_tidied():
    assert normalise_cron("  */5  *  * * mon-fri ") == "*/5 * * * MON-FRI"
    assert normalise_cron("0 0 * * * *") == "0 0 * * * *"


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * * *", "has 4"),
        ("* * * * * * *", "has 7"),
        ("61 * * * *", "Bad minute"),
        ("0 0 30 2 *", "invalid"),
        ("*/0 * * * *", "invalid"),
        ("", "non-empty"),
        (5, "non-empty"),
        ("0 " * 150, "longer than"),
        ("* * * * \x00", "invalid"),
    ],
)
def test_bad_cron_expressions_are_refused_with_a_sentence(expression, says):
    with pytest.raises(TimingError) as caught:
        normalise_cron(expression)
    assert caught.value.field == "cron"
    assert says in str(caught.value)


@pytest.mark.parametrize("name", ["Mars/Olympus", "../../etc/passwd", "", None, "Europe/\x00"])
def test_unknown_time_zones_are_refused(name):
    with pytest.raises(TimingError) as caught:
        zone(name)
    assert caught.value.field == "timezone"


def test_known_time_zones():
    assert zone("UTC") == ZoneInfo("UTC")
    assert zone(NEW_YORK).key == NEW_YORK


@pytest.mark.parametrize("value", [0, 0.5, -1, True, "60", float("nan"), float("inf"), 10**9])
def test_bad_intervals_are_refused(value):
    with pytest.raises(TimingError) as caught:
        check_every_seconds(value)
    assert caught.value.field == "every_seconds"


def test_intervals_accepted():
    assert check_every_seconds(1) == 1.0
    assert check_every_seconds(2.5) == 2.5
