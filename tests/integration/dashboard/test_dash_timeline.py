"""The job page's timeline: progress ticks fold into one line, a level
filter that holds across pages, a header per attempt, absolute times on hover."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.test import Client

from dashboard import render
from dashboard.detail import job_detail
from jobs.claims import ClaimedJob
from jobs.models import Job, JobEvent
from jobs.transitions import emit_event, fail_job
from tests.factories import (
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    claim,
    fresh,
    queued,
    running,
    tick,
)
from tests.integration.timelines import timeline_of

ENTRY = re.compile(r'<li class="ev [^"]*"[^>]*data-seq="(\d+)"')


def page(client: Client, job: Job, query: str = "") -> str:
    response = client.get(f"/dashboard/jobs/{job.pk}/{query}")
    assert response.status_code == 200
    return response.content.decode()


def shown_seqs(html: str) -> list[int]:
    return [int(seq) for seq in ENTRY.findall(html)]


def entry(html: str, seq: int) -> str:
    """The markup of the timeline entry with ``seq``."""
    match = re.search(rf'<li class="ev [^>]*data-seq="{seq}".*?</li>', html, re.S)
    assert match, f"no timeline entry #{seq}"
    return match.group(0)


def two_attempts() -> tuple[Job, ClaimedJob]:
    """A job whose first attempt ticked and failed (retryable), now in its second."""
    job, first = running(max_attempts=2)
    tick(job, first, 1, 4)
    status = fail_job(
        job.pk,
        lease_token=first.lease_token,
        error_code="TimeoutError",
        error_message="upstream slow",
        retryable=True,
        backoff_seconds=0,
    )
    assert status == "queued"
    return job, claim(job)


# --- progress ---------------------------------------------------------------------


def test_progress_fields_are_not_chips_and_quiet_ticks_fold_into_one_line(
    operator_client: Client,
) -> None:
    job, held = running()
    first = tick(job, held, 1, 5)
    tick(job, held, 2, 5)
    last = tick(job, held, 3, 5)
    html = page(operator_client, job)
    assert "_progress_" not in html  # neither chips nor anything else
    assert "3 / 5" in html and '<progress max="100" value="60.0"' in html  # the bar
    assert shown_seqs(html) == [1, 2, last]  # enqueued, started, the folded ticks
    folded = entry(html, last)
    assert 'data-count="3"' in folded and f'data-from-seq="{first}"' in folded
    assert "3 progress updates" in folded and "hidden" not in folded
    assert f'title="Events #{first} to #{last}"' in folded
    assert '<span class="ev-progress" title="Progress">3 / 5</span>' in folded


def test_only_ticks_that_say_nothing_new_fold(operator_client: Client) -> None:
    job, held = running()
    a = tick(job, held, 1, 9, "copying")
    b = tick(job, held, 2, 9, "copying")  # a repeated message folds with the one before
    c = tick(job, held, 3, 9, "verifying")  # a new message does not
    d = emit_event(
        job.pk,
        event="sleep.tick",
        fields={"_progress_current": 4, "rows": 120},  # another field: shown, never folded
        lease_token=held.lease_token,
    )
    e = tick(job, held, 5, 9, "verifying")  # d stands between c and e
    html = page(operator_client, job)
    assert shown_seqs(html) == [1, 2, b, c, d, e]
    assert 'data-count="2"' in entry(html, b) and f'data-from-seq="{a}"' in entry(html, b)
    assert "data-tick" not in entry(html, d)
    assert '<span class="k">rows</span><span class="v">120</span>' in entry(html, d)
    assert "_progress_" not in entry(html, d) and "4" in entry(html, d)


def test_a_live_tick_arrives_ready_to_fold(operator_client: Client) -> None:
    """Pushed and polled entries are rendered alone: each carries what live.js folds by."""
    job, held = running()
    last = tick(job, held, 1, 2)
    for html in (
        operator_client.get(f"/dashboard/jobs/{job.pk}/live/?after=2").content.decode(),
        render.job_live(job_detail(job.pk), "viewer", list(JobEvent.objects.filter(job=job))),
    ):
        live = entry(html, last)
        assert 'data-tick="sleep.tick"' in live and 'data-count="1"' in live
        assert f'data-from-seq="{last}"' in live
        assert '<span class="ev-folded" hidden>' in live
        assert "_progress_" not in live


def test_hostile_ticks_stay_text(operator_client: Client) -> None:
    job, held = running()
    for _ in range(2):
        emit_event(
            job.pk,
            event=HOSTILE_IMG,
            message=HOSTILE_SCRIPT,
            fields={"_progress_current": 1},
            lease_token=held.lease_token,
        )
    html = page(operator_client, job)
    assert "<img src=x" not in html and "<script>window.__pwned" not in html
    assert 'data-tick="&lt;img src=x onerror=&quot;window.__pwned=2&quot;&gt;"' in html
    assert "2 progress updates" in html


# --- level filter -------------------------------------------------------------------


def test_the_level_filter_keeps_warnings_errors_and_attempt_headers(
    operator_client: Client,
) -> None:
    job, second = two_attempts()
    fail_job(job.pk, lease_token=second.lease_token, error_code="E", error_message="gave up")
    names = dict(timeline_of(job))
    assert list(names.values()) == [
        "job.enqueued",
        "job.started",
        "sleep.tick",
        "job.retry_scheduled",
        "job.started",
        "job.failed",
    ]
    everything = page(operator_client, job)
    assert shown_seqs(everything) == [1, 2, 3, 4, 5, 6]
    assert shown_seqs(page(operator_client, job, "?level=info")) == [1, 2, 3, 4, 5, 6]

    warnings = page(operator_client, job, "?level=warning")
    assert shown_seqs(warnings) == [2, 4, 5, 6]
    errors = page(operator_client, job, "?level=error")
    assert shown_seqs(errors) == [2, 5, 6]
    # The live cursor continues after the job's last event, not the last one shown.
    assert 'data-cursor="6" data-level="error"' in errors
    assert shown_seqs(page(operator_client, job, "?level=nonsense")) == [1, 2, 3, 4, 5, 6]


def test_the_filter_links_mark_the_current_level(operator_client: Client) -> None:
    job, _ = running()
    html = page(operator_client, job, "?level=warning")
    base = f"/dashboard/jobs/{job.pk}/"
    assert f'<a href="{base}#job-timeline">All</a>' in html
    assert (
        f'<a href="{base}?level=warning#job-timeline" class="is-current" aria-current="true">'
        in html
    )
    assert f'<a href="{base}?level=error#job-timeline">Errors</a>' in html
    assert 'data-level="warning"' in html


def test_earlier_pages_keep_the_level_filter(operator_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("DASHBOARD_TIMELINE_PAGE", "2")
    job, held = running()
    warned = []
    for i in range(1, 5):
        tick(job, held, i, 4, f"step {i}")
        warned.append(
            emit_event(
                job.pk,
                event="disk.low",
                level="warning",
                message=f"low {i}",
                lease_token=held.lease_token,
            )
        )
    html = page(operator_client, job, "?level=warning")
    assert shown_seqs(html) == warned[-2:]
    link = f"/dashboard/jobs/{job.pk}/earlier/?before={warned[-2]}&amp;level=warning"
    assert link in html
    earlier = operator_client.get(link.replace("&amp;", "&")).content.decode()
    assert shown_seqs(earlier) == warned[:2]
    assert "step" not in earlier and "Show earlier events" in earlier  # the start is earlier
    last = operator_client.get(
        f"/dashboard/jobs/{job.pk}/earlier/?before={warned[0]}&level=warning"
    ).content.decode()
    assert shown_seqs(last) == [2] and "Show earlier events" not in last  # the attempt header


# --- attempts ---------------------------------------------------------------------------


def test_each_attempt_starts_under_its_own_header(operator_client: Client) -> None:
    job, _ = two_attempts()
    assert fresh(job).attempts == 2
    html = page(operator_client, job)
    headers = re.findall(r'class="ev level-info ev-attempt" data-seq="(\d+)"', html)
    assert headers == ["2", "5"]
    assert 'data-attempt="1"' in entry(html, 2) and "Attempt 1</strong>" in entry(html, 2)
    assert 'data-attempt="2"' in entry(html, 5) and "Attempt 2</strong>" in entry(html, 5)
    timeline = html[html.index('id="timeline"') :]
    assert (
        timeline.index("Attempt 1</strong>")
        < timeline.index("upstream slow")
        < timeline.index("Attempt 2</strong>")
    )
    assert "Attempt" not in entry(html, 3)


# --- times ------------------------------------------------------------------------------


def test_every_relative_time_carries_its_absolute_time(operator_client: Client) -> None:
    job, held = running()
    tick(job, held, 1, 3)
    html = page(operator_client, job)
    times = re.findall(r'<time datetime="([^"]+)" data-rel title="([^"]+)">', html)
    assert len(times) == len(re.findall(r"<time ", html)) >= 5  # timing, ETA, each entry
    for iso, title in times:
        at = datetime.fromisoformat(iso).astimezone(UTC)
        assert title == at.strftime("%Y-%m-%d %H:%M:%S UTC")


def test_a_filter_that_matches_nothing_says_so(operator_client: Client) -> None:
    job = queued()  # only job.enqueued, an info event
    assert shown_seqs(page(operator_client, job)) == [1]
    html = page(operator_client, job, "?level=warning")
    assert shown_seqs(html) == []
    assert "No events at this level yet." in html
