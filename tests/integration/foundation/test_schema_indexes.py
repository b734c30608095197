"""The hot reads still find an index after 0002 made three Job indexes partial.

Sequential scans are switched off so the plan shows whether an index *can*
serve the query: a partial index whose predicate the query does not imply
is never offered, and the plan then falls back to a (disabled) Seq Scan.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]

W, P = str(uuid.uuid4()), str(uuid.uuid4())

QUERIES = {
    # workers/reaper.py via jobs/rescues.py: expired leases or gone workers.
    "reaper": (
        "SELECT id FROM controlplane_job WHERE status = 'running' AND (leased_until < now() "
        f"OR worker_id IN ('{W}')) LIMIT 500",
        # Either partial index covers exactly the running rows.
        [{"job_running_lease_idx", "job_worker_idx"}],
    ),
    # workers/reaper.py Reaper._retention.
    "retention": (
        "SELECT j.id FROM controlplane_job j "
        "WHERE j.status IN ('succeeded', 'failed', 'cancelled') "
        "AND j.finished_at < now() - interval '7 days' AND NOT EXISTS "
        "(SELECT 1 FROM controlplane_job c WHERE c.parent_id = j.id) LIMIT 500",
        [{"job_finished_idx"}, {"job_parent_idx"}],
    ),
    # dashboard/selectors.py throughput and jobs/selectors/queues.py.
    "throughput": (
        "SELECT date_trunc('minute', finished_at), count(*) FROM controlplane_job "
        "WHERE status IN ('succeeded', 'failed') AND finished_at >= now() - interval '1 hour' "
        "GROUP BY 1",
        [{"job_finished_idx"}],
    ),
    # jobs/selectors/jobs.py job_children_counts.
    "children": (
        f"SELECT status, count(id) FROM controlplane_job WHERE parent_id = '{P}' GROUP BY status",
        [{"job_parent_idx"}],
    ),
    # dashboard/selectors.py worker_rows and django_controlplane/remote/workers.py held_jobs.
    "current jobs": (
        f"SELECT id FROM controlplane_job WHERE status = 'running' AND worker_id IN ('{W}') "
        "ORDER BY started_at",
        [{"job_worker_idx"}],
    ),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_query_uses_its_index(name):
    sql, groups = QUERIES[name]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(r[0] for r in cursor.fetchall())
    assert "Seq Scan on controlplane_job" not in plan, plan
    for group in groups:
        assert any(index in plan for index in group), f"none of {group} for {name}:\n{plan}"
