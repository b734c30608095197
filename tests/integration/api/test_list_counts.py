"""GET /jobs counts: dear counts are reused for a few seconds per process, cheap ones never."""

from __future__ import annotations

import time

import pytest

from jobs import selectors
from jobs.selectors import counts
from jobs.selectors import jobs as job_selectors
from tests.factories import queued


@pytest.fixture
def kept(monkeypatch):
    """A private cache that keeps counts of 3 rows or more for a minute."""
    recent = counts.RecentCounts(seconds=60, min_rows=3)
    monkeypatch.setattr(job_selectors, "recent_counts", recent)
    return recent


@pytest.mark.django_db
def test_a_dear_count_is_reused_within_its_seconds(viewer, kept):
    for _ in range(3):
        queued()
    assert viewer.get("/jobs", limit=1).json()["count"] == 3
    queued()
    # The page is read afresh; the count is the one made a moment ago.
    body = viewer.get("/jobs", limit=1).json()
    assert body["count"] == 3 and len(body["results"]) == 1
    assert viewer.get("/jobs", limit=1, count="true").json()["count"] == 3
    # Other filters are other counts; fresh=True and a cleared cache count again.
    assert viewer.get("/jobs", limit=1, status="queued").json()["count"] == 4
    assert selectors.job_count(selectors.JobFilters(), fresh=True).value == 4
    kept.clear()
    assert viewer.get("/jobs", limit=1).json()["count"] == 4


@pytest.mark.django_db
def test_a_cheap_count_is_always_counted(viewer, kept):
    queued()
    queued()
    assert viewer.get("/jobs", limit=1).json()["count"] == 2
    queued()  # now 3: counted, and from here on kept
    assert viewer.get("/jobs", limit=1).json()["count"] == 3
    queued()
    assert viewer.get("/jobs", limit=1).json()["count"] == 3


@pytest.mark.django_db
def test_a_kept_count_expires(viewer, monkeypatch):
    recent = counts.RecentCounts(seconds=0.2, min_rows=1)
    monkeypatch.setattr(job_selectors, "recent_counts", recent)
    queued()
    assert viewer.get("/jobs").json()["count"] == 1
    queued()
    assert viewer.get("/jobs").json()["count"] == 1
    time.sleep(0.3)
    assert viewer.get("/jobs").json()["count"] == 2


@pytest.mark.django_db
def test_the_cap_and_the_database_are_part_of_the_key(kept, settings):
    for _ in range(4):
        queued()
    assert selectors.job_count(selectors.JobFilters(), cap=3).value == 3
    assert selectors.job_count(selectors.JobFilters(), cap=3).capped is True
    assert selectors.job_count(selectors.JobFilters(), cap=100).value == 4


def test_a_count_out_of_time_is_kept_and_the_cache_stays_bounded():
    recent = counts.RecentCounts(seconds=60, min_rows=1000, entries=2)
    calls = []

    def out_of_time() -> counts.CountResult:
        calls.append(1)
        return counts.CountResult(value=None, capped=True)

    assert recent.get("rare text", out_of_time).value is None
    assert recent.get("rare text", out_of_time).value is None
    assert len(calls) == 1  # a second that ran out is not spent again at once
    recent.get("b", out_of_time)
    recent.get("c", out_of_time)  # pushes out the oldest
    recent.get("rare text", out_of_time)
    assert len(calls) == 4
