"""A job's log lines on its page: on the timeline as text, live as on first load."""

from __future__ import annotations

import re

from django.test import Client

from jobs.events import JOB_LOG
from jobs.transitions import RunEvent, append_run_events
from tests.factories import HOSTILE_IMG, HOSTILE_SCRIPT, running


def log_line(message: str, level: str = "info") -> RunEvent:
    fields = {"logger": "ops.import", "levelname": level.upper(), "source": "logging"}
    return RunEvent(JOB_LOG, level, message, fields)


def entry(html: str, seq: int) -> str:
    match = re.search(rf'<li class="ev [^>]*data-seq="{seq}".*?</li>', html, re.S)
    assert match, f"no timeline entry #{seq}"
    return match.group(0)


def test_log_lines_show_escaped_on_the_job_page_and_live(operator_client: Client) -> None:
    job, held = running()
    traceback = "failed\nTraceback (most recent call last):\n  File <x>"
    append_run_events(
        job.pk,
        [log_line(HOSTILE_SCRIPT), log_line(HOSTILE_IMG, "warning"), log_line(traceback, "error")],
        lease_token=held.lease_token,
    )
    for html in (
        operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode(),
        operator_client.get(f"/dashboard/jobs/{job.pk}/live/?after=2").content.decode(),
    ):
        assert "<script>window.__pwned" not in html and "<img src=x" not in html
        first = entry(html, 3)
        assert "ev-log" in first and "level-info" in first
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in first
        assert '<span class="k">logger</span><span class="v">ops.import</span>' in first
        assert "level-warning" in entry(html, 4)
        assert "Traceback (most recent call last):\n  File &lt;x&gt;" in entry(html, 5)
