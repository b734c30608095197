"""The job list's view tabs: links over the core's ``JobFilters`` (``jobs.selectors``).

Reading, applying and writing filters back as a URL are the core's, shared
with the API and the ``jobs`` command; what is here is only how the list
page offers them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from dashboard.inputs import printable
from jobs import waiting
from jobs.selectors import JobFilters, parse_uuid, read_job_filters


def when_tabs(filters: JobFilters) -> list[tuple[str, str, bool]]:
    """The list's view links ``(label, querystring, current)``: all jobs, scheduled, retrying.

    Each keeps the other filters; a waiting view drops ``status``, which it
    sets itself (queued).
    """
    tabs = [("All", replace(filters, when="").querystring(), not filters.when)]
    for kind in waiting.KINDS:
        query = replace(filters, when=kind, status=()).querystring()
        tabs.append((kind.capitalize(), query, filters.when == kind))
    return tabs


@dataclass(frozen=True)
class DashboardJobFilters(JobFilters):
    """The core's ``JobFilters`` and the job list's ``workflow`` (``?workflow=<id>``): a
    workflow's steps.

    Kept on the dashboard's side of the core's filter vocabulary: every place
    the dashboard reads job filters (its list, count, live updates and bulk
    actions) reads them with ``read_dashboard_filters``, so a bulk action on
    a workflow's list acts on that workflow's steps only.
    """

    workflow: uuid.UUID | None = None

    @property
    def is_empty(self) -> bool:
        return self == DashboardJobFilters()

    def params(self) -> list[tuple[str, str]]:
        out = super().params()
        if self.workflow is not None:
            out.append(("workflow", str(self.workflow)))
        return out

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.workflow is not None:
            out["workflow"] = str(self.workflow)
        return out

    def apply(self, queryset: QuerySet[Any], *, now: datetime | None = None) -> QuerySet[Any]:
        qs = super().apply(queryset, now=now)
        if self.workflow is not None:
            qs = qs.filter(workflow_id=self.workflow)
        return qs

    def matches(self, job: dict[str, Any], *, now: datetime | None = None) -> bool:
        if self.workflow is not None and str(job.get("workflow_id") or "") != str(self.workflow):
            return False
        return super().matches(job, now=now)


def read_dashboard_filters(data: Mapping[str, Any]) -> DashboardJobFilters:
    """``read_job_filters`` and ``workflow``; an unreadable workflow id is in ``errors``."""
    core = read_job_filters(data)
    values = {f.name: getattr(core, f.name) for f in fields(JobFilters)}
    raw = data.get("workflow")
    raw = raw.strip() if isinstance(raw, str) else ""
    workflow = None
    if raw:
        workflow = parse_uuid(raw)
        core.raw["workflow"] = printable(raw)
        if workflow is None:
            core.errors["workflow"] = "The workflow must be a workflow id."
    return DashboardJobFilters(**values, workflow=workflow)
