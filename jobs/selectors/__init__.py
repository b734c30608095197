"""Reads for the REST API and the dashboard.

Plain keyword-friendly functions over the ORM, named ``<entity>_<what>``;
views and templates call these and never build job querysets themselves, so
every page and endpoint reads the same way and stays on an index:

- ``job_list(filters, cursor, limit)``: newest first, keyset-paginated on
  ``(created_at, id)`` (the ``job_created_idx`` index), so page 10,000 costs
  what page 1 costs.
- ``estimated_count(queryset, cap)``: counts at most ``cap`` rows, never the
  whole table; ``job_count`` counts jobs that way (``CountResult``, the one
  count type every face shows).
- ``job_events_after(job_id, after, limit)``: the timeline cursor over the
  per-job ``seq`` (the unique ``(job, seq)`` index); ``job_events_page`` adds
  the job's last seq in the same statement (the polled ``/events`` endpoint).
- ``queue_stats()`` / ``queue_detail(name)`` and ``worker_list()`` /
  ``worker_detail(id)``: the operator overviews.
- ``jobs.selectors.flow_keys``: which flow keys hold jobs back
  (``held_back``), why one queued job is not starting (``waiting_reason``),
  and the ``/metrics`` view of both (``held_back_by_family``). Imported
  from its module: it reads through ``jobs.replica``, which imports this
  package.

Filters come in as a ``JobFilters`` value; ``job_filters_from_query`` builds
one from a query string or a JSON body and names the fields it refuses
(``read_job_filters`` keeps them in ``errors`` instead, for a page).

Import from ``jobs.selectors`` itself; the submodules (``filters``,
``filter_query``, ``values``, ``payload``, ``jobs``, ``counts``, ``queues``,
``workers``) are how the code is arranged, not API.
"""

from jobs.selectors.counts import (
    COUNT_TIMEOUT_MS,
    CountResult,
    capped_count,
    count_cap,
    estimated_count,
    table_estimate,
)
from jobs.selectors.filter_query import FILTER_KEYS, job_filters_from_query, read_job_filters
from jobs.selectors.filters import RANGES, STATES, JobFilters, text_query
from jobs.selectors.jobs import (
    DEFAULT_EVENT_LIMIT,
    DEFAULT_PAGE_SIZE,
    MAX_EVENT_LIMIT,
    MAX_PAGE_SIZE,
    JobCursor,
    JobPage,
    after_cursor,
    job_children_counts,
    job_count,
    job_events_after,
    job_events_page,
    job_get,
    job_ids_batches,
    job_list,
    job_queryset,
)
from jobs.selectors.queues import QueueStats, queue_detail, queue_stats
from jobs.selectors.values import InvalidFilter, parse_limit, parse_timestamp, parse_uuid
from jobs.selectors.workers import (
    WorkerInfo,
    live_worker_ids,
    stale_before,
    worker_detail,
    worker_list,
)
from jobs.storable import unstorable_text

__all__ = [
    "COUNT_TIMEOUT_MS",
    "DEFAULT_EVENT_LIMIT",
    "DEFAULT_PAGE_SIZE",
    "FILTER_KEYS",
    "MAX_EVENT_LIMIT",
    "MAX_PAGE_SIZE",
    "RANGES",
    "STATES",
    "CountResult",
    "InvalidFilter",
    "JobCursor",
    "JobFilters",
    "JobPage",
    "QueueStats",
    "WorkerInfo",
    "after_cursor",
    "capped_count",
    "count_cap",
    "estimated_count",
    "job_children_counts",
    "job_count",
    "job_events_after",
    "job_events_page",
    "job_filters_from_query",
    "job_get",
    "job_ids_batches",
    "job_list",
    "job_queryset",
    "live_worker_ids",
    "parse_limit",
    "parse_timestamp",
    "parse_uuid",
    "read_job_filters",
    "stale_before",
    "table_estimate",
    "text_query",
    "queue_detail",
    "queue_stats",
    "unstorable_text",
    "worker_detail",
    "worker_list",
]
