"""The job list and the job page, with their polling endpoints."""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone

from dashboard import detail as detail_reads
from dashboard import render as fragments
from dashboard import selectors
from dashboard.filters import when_tabs
from dashboard.views.common import base_context, no_store, page
from jobs.models import Job, RemoteOperation
from jobs.operations import registry
from jobs.permissions import role_of
from jobs.selectors import (
    RANGES,
    InvalidFilter,
    job_count,
    parse_timestamp,
    parse_uuid,
    read_job_filters,
)
from jobs.selectors.counts import capped_count

# The timeline's level filter links: (query value, label); "" shows everything.
LEVEL_FILTERS = (("", "All"), ("warning", "Warnings and errors"), ("error", "Errors"))


def _list_context(request: HttpRequest) -> dict:
    loaded_at = timezone.now()  # before the reads: later changes reach the page live
    filters = read_job_filters(request.GET)
    after, before = request.GET.get("after", ""), request.GET.get("before", "")
    cursor_error = ""
    try:
        result = selectors.job_page(filters, after=after, before=before)
    except InvalidFilter:
        cursor_error = "That page link is no longer valid; showing the newest jobs."
        result = selectors.job_page(filters)
        after = before = ""
    return {
        "filters": filters,
        "when_tabs": when_tabs(filters),
        "page": result,
        "jobs": result.jobs,
        "first_page": not (after or before) or result.prev_cursor is None,
        "queue_names": selectors.queue_names(),
        "operation_names": _operation_names(),
        "ranges": list(RANGES),
        "states": selectors.STATES,
        "cursor_error": cursor_error,
        "query": filters.querystring(),
        "loaded_at": loaded_at,
    }


def _operation_names() -> list[str]:
    remote = RemoteOperation.objects.filter(deleted=False).values_list("name", flat=True)
    return sorted({*registry.names(), *remote})


@page
def job_list(request: HttpRequest) -> HttpResponse:
    return render(
        request, "dashboard/jobs.html", {**base_context(request, "jobs"), **_list_context(request)}
    )


@page
def job_list_live(request: HttpRequest) -> HttpResponse:
    """Polling fallback for the list: fresh rows for the ids shown, and the new-jobs notice."""
    ids = [i for i in (parse_uuid(v) for v in request.GET.get("ids", "").split(",")[:200]) if i]
    role = role_of(request.user)
    html = fragments.rows_oob(selectors.job_rows(ids), role)
    newest = parse_timestamp(request.GET.get("newest"))
    if newest is not None:
        filters = read_job_filters(request.GET)
        fresh = capped_count(filters.apply(Job.objects.filter(created_at__gt=newest)), limit=999)
        if fresh.value:
            html += fragments.new_jobs_banner(fresh.value, filters.querystring(), many=fresh.capped)
    return no_store(HttpResponse(html))


@page
def job_list_count(request: HttpRequest) -> HttpResponse:
    """The list's count, loaded after the page: a rare filter may take a second to count."""
    filters = read_job_filters(request.GET)
    total = job_count(filters, estimate_table=True)
    context = {"total": total if total.known else None, "filters": filters, "counted": True}
    return HttpResponse(render_to_string(f"{fragments.LIST_TEMPLATE}#total", context))


def _detail_or_404(job_id: uuid.UUID) -> detail_reads.JobDetail:
    detail = detail_reads.job_detail(job_id)
    if detail is None:
        raise Http404("No such job.")
    return detail


def _timeline_context(
    job_id: uuid.UUID, level: str, *, before: int | None = None, cursor: int = 0
) -> dict:
    """One page of the timeline as lines, with what its links and ``live.js`` need:
    the seq to page back from and the cursor live updates continue after."""
    events, earlier = detail_reads.timeline(job_id, before=before, level=level)
    return {
        "entries": detail_reads.timeline_entries(events),
        "earlier": earlier,
        "earliest_seq": events[0].seq if events else 0,
        # A filter hides events: continue after the job's last one, not the last shown.
        "last_seq": max(cursor, events[-1].seq if events else 0),
        "level": level,
        "level_filters": LEVEL_FILTERS,
    }


@page
def job_page(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    detail = _detail_or_404(job_id)
    level = detail_reads.timeline_level(request.GET.get("level"))
    context = {
        **base_context(request, "jobs"),
        **fragments.job_context(detail, role_of(request.user)),
        **_timeline_context(job_id, level, cursor=detail.job.last_event_seq),
    }
    return render(request, fragments.JOB_TEMPLATE, context)


def _int(raw: str | None, default: int = 0) -> int:
    try:
        return max(0, int(raw or default))
    except ValueError:
        return default


@page
def job_live(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """Polling fallback for the job page: the same fragments a WebSocket push carries."""
    detail = _detail_or_404(job_id)
    events = detail_reads.events_after(job_id, _int(request.GET.get("after")))
    response = HttpResponse(fragments.job_live(detail, role_of(request.user), events))
    # Every change of a job writes an event: its last seq tells the poller whether
    # anything changed (the estimated finish in the answer moves on its own).
    response["X-Live-Version"] = str(detail.job.last_event_seq)
    return no_store(response)


@page
def job_earlier(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """Older timeline entries, loaded on demand above the ones shown (same level filter)."""
    before = _int(request.GET.get("before"))
    level = detail_reads.timeline_level(request.GET.get("level"))
    context = {"job": {"id": job_id}, **_timeline_context(job_id, level, before=before)}
    return HttpResponse(render_to_string(f"{fragments.JOB_TEMPLATE}#earlier-page", context))
