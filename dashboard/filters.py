"""The job list's view tabs: links over the core's ``JobFilters`` (``jobs.selectors``).

Reading, applying and writing filters back as a URL are the core's, shared
with the API and the ``jobs`` command; what is here is only how the list
page offers them.
"""

from __future__ import annotations

from dataclasses import replace

from jobs import waiting
from jobs.selectors import JobFilters


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
