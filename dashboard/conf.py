"""Dashboard-only tunables, with named defaults.

The control plane's own knobs (``COUNT_CAP``, ``DASHBOARD_STATEMENT_TIMEOUT_MS``,
``WORKER_TIMEOUT_SECONDS``) stay in ``jobs.conf``; these only shape the pages
and the live relay, so each reads ``DASHBOARD_<NAME>`` from the environment
and otherwise uses the default here.
"""

from __future__ import annotations

import os

DEFAULTS: dict[str, float] = {
    # Rows per job-list page and timeline entries per page of history.
    "PAGE_SIZE": 50,
    "TIMELINE_PAGE": 100,
    # The relay (one reader per web process). On PostgreSQL it reads when the
    # event trigger's NOTIFY arrives, after a short debounce, and at least every
    # safety interval; on SQLite it polls every RELAY_INTERVAL_SECONDS.
    "RELAY_INTERVAL_SECONDS": 0.5,
    "RELAY_DEBOUNCE_SECONDS": 0.1,
    "RELAY_SAFETY_POLL_SECONDS": 5.0,
    # Skipped event ids (a transaction still open, or rolled back) are looked
    # up again for this long, so a late commit is still reported.
    "RELAY_HOLE_SECONDS": 60.0,
    # New jobs are found by creation time (their enqueue event is implied, not
    # stored): each read looks back this far for transactions that committed late.
    "RELAY_NEW_JOBS_LOOKBACK_SECONDS": 10.0,
    # Summary pages (overview, queues, workers) are re-rendered at most this
    # often, and workers at least this often for heartbeat ages.
    "SUMMARY_REFRESH_SECONDS": 2.0,
    "WORKERS_REFRESH_SECONDS": 5.0,
    # Polling fallback when the WebSocket cannot connect: start here, double
    # when nothing changed or the answer was slow, never beyond the maximum.
    "POLL_BASE_MS": 2000,
    "POLL_MAX_MS": 30000,
    "POLL_SLOW_MS": 1000,
    # New jobs the relay describes per tick for the list's "new jobs" notice.
    "RELAY_NEW_JOBS_MAX": 200,
    # Recent windows.
    "FAILURE_WINDOW_HOURS": 24,
    "RECLAIM_WINDOW_HOURS": 1,
    "CHILDREN_SHOWN": 100,
    # A workflow page draws each step as a box up to this many steps; past it,
    # counts per depth and status (dashboard.workflow_graph).
    "WORKFLOW_MAX_BOXES": 500,
}


def setting(name: str) -> float:
    """The value of a dashboard tunable; ``DASHBOARD_<NAME>`` in the environment wins."""
    raw = os.environ.get(f"DASHBOARD_{name}")
    default = DEFAULTS[name]
    if raw:
        return type(default)(float(raw)) if isinstance(default, int) else float(raw)
    return default
