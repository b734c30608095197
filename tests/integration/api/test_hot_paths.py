"""What the polled endpoints cost in queries, authentication included: one or two.

The token is read once per ``TOKEN_CACHE_SECONDS`` per process, queue settings once per
``QUEUE_SETTINGS_CACHE_SECONDS``; the counts are of a poll after the first, as pollers see them.
"""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.enqueue import enqueue


def queries(call) -> tuple[object, list[str]]:
    with CaptureQueriesContext(connection) as ctx:
        response = call()
    return response, [q["sql"] for q in ctx.captured_queries]


def test_polling_a_timeline_costs_one_query(api_for):
    viewer = api_for("viewer")
    job = enqueue("ping")
    viewer.get(f"/jobs/{job.pk}/events")  # the token is read once here
    response, sql = queries(lambda: viewer.get(f"/jobs/{job.pk}/events", after=1))
    assert response.status_code == 200
    assert len(sql) == 1, sql


def test_reading_a_job_costs_two_queries(api_for):
    viewer = api_for("viewer")
    job = enqueue("ping")
    viewer.get(f"/jobs/{job.pk}")
    response, sql = queries(lambda: viewer.get(f"/jobs/{job.pk}"))
    assert response.status_code == 200
    assert len(sql) <= 2, sql


def test_a_remote_worker_s_heartbeat_and_empty_claim_cost_two_queries(api_for):
    remote = api_for("remote")
    worker = remote.post("/workers", {"name": "w", "operations": ["ping"]}).json()["id"]
    remote.request("PATCH", f"/workers/{worker}", {"held": []})
    response, sql = queries(lambda: remote.request("PATCH", f"/workers/{worker}", {"held": []}))
    assert response.status_code == 200, response.content
    assert len(sql) <= 2, sql
    remote.post(f"/workers/{worker}/claim", {"limit": 1})  # queue settings: read once a second
    response, sql = queries(lambda: remote.post(f"/workers/{worker}/claim", {"limit": 1}))
    assert response.status_code == 200 and response.json()["jobs"] == [], response.content
    assert len(sql) <= 2, sql


def test_a_listed_job_reads_exactly_as_the_job_itself(api_for):
    """The list represents its jobs through the shared serializer: same fields, same values."""
    viewer = api_for("viewer")
    made = [
        enqueue("ping"),
        enqueue("ping", priority=3, unique_key="once", max_attempts=2),
        enqueue("ping", idempotency_key="<b>x</b>"),
    ]
    listed = viewer.get("/jobs", limit=10).json()["results"]
    assert [item["id"] for item in listed] == [str(job.pk) for job in reversed(made)]
    for item in listed:
        detail = viewer.get(f"/jobs/{item['id']}").json()
        assert set(detail) - set(item) == {"children"}  # the detail's own extra
        assert item == {key: detail[key] for key in item}
