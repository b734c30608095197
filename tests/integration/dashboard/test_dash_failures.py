"""Failures on the dashboard: the job page's collapsed traceback, the overview's groups."""

from __future__ import annotations

import re

from django.test import Client

from dashboard import render, selectors
from dashboard.detail import job_detail
from jobs.failures import fingerprint, format_traceback, innermost_frame
from jobs.models import Job, JobEvent
from jobs.transitions import fail_job
from tests.factories import HOSTILE_SCRIPT, failed, running, unique_queue

TRACEBACK_BLOCK = re.compile(
    r'<details class="traceback" id="traceback-(\d+)" hx-preserve="true">'
    r'<summary>Traceback</summary><pre class="json traceback-text">(.*?)</pre></details>',
    re.S,
)


def charge_card(message: str) -> None:
    raise RuntimeError(message)


def send_mail(message: str) -> None:
    raise RuntimeError(message)


def raised(raiser, message: str) -> RuntimeError:
    try:
        raiser(message)
    except RuntimeError as error:
        return error
    raise AssertionError("unreachable")


def failed_by(raiser, message: str, **options) -> Job:
    """A job failed the way a worker fails it: with the raised error's traceback and frame."""
    job, held = running(**options)
    error = raised(raiser, message)
    fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code=type(error).__name__,
        error_message=str(error),
        traceback=format_traceback(error),
        frame=innermost_frame(error),
    )
    return job


def test_the_job_page_shows_the_traceback_collapsed_and_escaped(operator_client: Client) -> None:
    job = failed_by(charge_card, f"card declined {HOSTILE_SCRIPT}")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    [(seq, trace)] = TRACEBACK_BLOCK.findall(html)  # <details> without ``open``: collapsed
    assert int(seq) == Job.objects.get(pk=job.pk).last_event_seq  # the job.failed event
    assert "in charge_card" in trace
    assert "RuntimeError: card declined &lt;script&gt;window.__pwned=1&lt;/script&gt;" in trace
    assert "<script>window.__pwned" not in html
    # Near the error: inside the error card, after the message.
    card = html[html.index('class="card error-card"') :]
    assert card.index('class="error-message"') < card.index('class="traceback"')
    # The live fragment renders the same block (kept open across updates by hx-preserve).
    live = render.job_live(job_detail(job.pk), "operator", [])
    assert TRACEBACK_BLOCK.findall(live) == [(seq, trace)]


def test_a_failure_without_a_traceback_shows_no_block(operator_client: Client) -> None:
    job = failed(code="JobExpired", message="The job expired before a worker could run it.")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    assert "JobExpired" in html and "<summary>Traceback</summary>" not in html


def test_an_error_not_from_the_failure_event_borrows_no_traceback(operator_client: Client) -> None:
    # The job's error changed after its failure event (as a reaper's own write would).
    job = failed_by(charge_card, "declined")
    Job.objects.filter(pk=job.pk).update(error_code="LeaseExpired", error_message="gone")
    html = operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    assert "LeaseExpired" in html and "<summary>Traceback</summary>" not in html


def test_recent_failures_group_by_fingerprint_not_class(
    operator_client: Client, django_assert_max_num_queries
) -> None:
    queue = unique_queue()
    # Four failures of one class and operation, two messages (ids differ within each).
    for account in (17, 4242):
        failed_by(charge_card, f"quota exceeded for account {account}", queue=queue)
    for _ in range(2):
        failed_by(charge_card, "card network unreachable", queue=queue)
    with django_assert_max_num_queries(2):  # the sample of failed jobs, then their events
        groups = selectors.recent_failures()
    assert [(g.error_code, g.count) for g in groups] == [("RuntimeError", 2)] * 2
    assert {g.sample_message for g in groups} == {
        "quota exceeded for account 4242",
        "card network unreachable",
    }
    assert {g.fingerprint for g in groups} == {
        fingerprint(
            "RuntimeError", "quota exceeded for account 1", "test_dash_failures.py:charge_card"
        ),
        fingerprint(
            "RuntimeError", "card network unreachable", "test_dash_failures.py:charge_card"
        ),
    }
    html = operator_client.get("/dashboard/").content.decode()
    assert html.count('class="failure-head"') == 2 and html.count("2×") == 2
    assert "quota exceeded for account 4242" in html and "card network unreachable" in html


def test_the_same_message_raised_elsewhere_is_another_failure(db) -> None:
    failed_by(charge_card, "timed out")
    failed_by(send_mail, "timed out")
    assert sorted(g.count for g in selectors.recent_failures()) == [1, 1]


def test_failures_recorded_before_fingerprints_group_by_class_and_message(db) -> None:
    old = [
        failed(code="KeyError", message=message) for message in ("'user 1'", "'user 2'", "'team'")
    ]
    # Events written before this change had the error fields only.
    for job in old:
        JobEvent.objects.filter(job_id=job.pk, event="job.failed").update(
            fields={"error_code": "KeyError", "error_message": "x"}
        )
    counts = sorted((g.count, g.sample_message) for g in selectors.recent_failures())
    assert counts == [(1, "'team'"), (2, "'user 2'")]


def test_recent_failures_say_when_they_read_a_sample(db, monkeypatch) -> None:
    monkeypatch.setattr(selectors, "FAILURE_SAMPLE", 2)
    monkeypatch.setattr(selectors, "FAILURE_EVENTS_PER_QUERY", 1)
    for n in range(3):
        failed_by(charge_card, f"declined {n}")
    [group] = selectors.recent_failures()
    assert (group.count, group.sample_size, group.sample_message) == (2, 2, "declined 2")
