"""GET /jobs writes each job's JSON in PostgreSQL (``sql_document``): the same values as
``JobSerializer``, whatever the columns hold. On SQLite the page is represented in Python."""

from __future__ import annotations

import json
import uuid
import zoneinfo
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_controlplane.api.serializers import JobSerializer, sql_document
from jobs import selectors
from jobs.models import Job

pytestmark = pytest.mark.django_db


def _make_jobs() -> list[Job]:
    base = datetime(2026, 11, 27, 1, 2, 3, 456789, tzinfo=UTC)
    made = [
        Job.objects.create(
            id=uuid.uuid4(),
            operation="ping",
            queue="q-docs",
            payload={},
            created_at=base,
            run_after=base,
        ),
        Job.objects.create(
            id=uuid.uuid4(),
            operation="billing.charge",
            queue="emails",
            status="failed",
            priority=-7,
            payload={"a": [1, 2.5, None, True, 1e-7, 12345678901234567890], "b": {"c": 'ü\n"\\'}},
            result={"ok": False, "nested": {"deep": [[]]}},
            error_code="Boom",
            error_message="line one\nline two \u2028 and \u2029, \t tab \x01 control",
            attempts=3,
            max_attempts=5,
            progress_current=4,
            progress_total=10,
            created_at=base.replace(microsecond=0) + timedelta(seconds=1),
            run_after=base + timedelta(days=400),
            started_at=base - timedelta(hours=5, microseconds=1),
            finished_at=base + timedelta(microseconds=10),
            leased_until=base + timedelta(seconds=30),
            expires_at=datetime(2027, 1, 1, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
            unique_key="key-1",
            unique_while="until_retention",
            timeout_seconds=2.5,
        ),
        Job.objects.create(
            id=uuid.uuid4(),
            operation="x",
            queue="q-docs",
            payload={"n": 1, "f": 3.0, "s": "a" * 300},
            unique_key="key-2",
            unique_while="active",
            timeout_seconds=3.0,
            created_at=base + timedelta(seconds=2),
            run_after=base,
        ),
        Job.objects.create(
            id=uuid.uuid4(),
            operation="y",
            queue="q-docs",
            payload={},
            timeout_seconds=0.1,
            created_at=base + timedelta(seconds=3),
            run_after=datetime(2026, 1, 1, tzinfo=UTC),
        ),
    ]
    made[1].parent_id = made[0].pk
    Job.objects.filter(pk=made[1].pk).update(parent_id=made[0].pk)
    return made


def _drf_page() -> list[dict]:
    newest_first = Job.objects.order_by("-created_at", "-id")
    return [json.loads(json.dumps(JobSerializer(job).data)) for job in newest_first]


def test_the_list_gives_what_the_serializer_gives(viewer):
    _make_jobs()
    response = viewer.get("/jobs", limit=10)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["results"] == _drf_page()
    assert body["next"] is None and body["count"] == 4 and body["count_capped"] is False
    # Exact types too: a whole float stays a float, an id a string, no date moved.
    shown = {job["operation"]: job for job in body["results"]}
    assert shown["x"]["timeout_seconds"] == 3.0 and isinstance(shown["x"]["timeout_seconds"], float)
    assert shown["billing.charge"]["created_at"] == "2026-11-27T01:02:04Z"
    assert shown["billing.charge"]["finished_at"] == "2026-11-27T01:02:03.456799Z"
    assert shown["billing.charge"]["idempotency_key"] == "key-1"
    assert shown["x"]["idempotency_key"] is None
    assert "\\u2028" in response.content.decode()  # escaped, as DRF's renderer escapes it


def test_pages_and_filters_walk_the_same_jobs(viewer):
    _make_jobs()
    expected = _drf_page()
    seen, url = [], "/jobs?limit=1&queue=q-docs,emails"
    while url:
        body = viewer.client.get(url, headers=viewer.headers).json()
        seen += body["results"]
        url = body["next"]
    assert seen == expected
    failed = viewer.get("/jobs", status="failed").json()["results"]
    assert failed == [job for job in expected if job["status"] == "failed"]


def test_the_database_writes_the_page_on_postgresql_only():
    _make_jobs()
    document = sql_document(JobSerializer)
    page = selectors.job_list(selectors.JobFilters(), None, 10, document=document)
    if connection.vendor == "postgresql":
        assert page.results == [] and len(page.documents) == 4
        assert [json.loads(d) for d in page.documents] == _drf_page()
    else:
        assert page.documents is None and len(page.results) == 4


def test_another_time_zone_is_represented_in_python(viewer, settings):
    _make_jobs()
    with timezone.override(zoneinfo.ZoneInfo("Asia/Tokyo")):
        assert sql_document(JobSerializer) is None
    settings.TIME_ZONE = "Asia/Tokyo"
    with timezone.override(zoneinfo.ZoneInfo("Asia/Tokyo")):
        body = viewer.get("/jobs", limit=10).json()
        assert body["results"] == _drf_page()
    assert body["results"][0]["created_at"].endswith("+09:00")


def test_a_polled_page_is_compiled_once_and_read_afresh(viewer, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the documents page is PostgreSQL's")
    from jobs.selectors import jobs as job_selectors

    monkeypatch.setattr(job_selectors, "_statements", type(job_selectors._statements)())
    compiled = []
    real = job_selectors._compiled

    def counting(document, using):
        compiled.append(using)
        return real(document, using)

    monkeypatch.setattr(job_selectors, "_compiled", counting)
    made = _make_jobs()
    first = viewer.get("/jobs", limit=2, queue="q-docs").json()
    assert [j["id"] for j in first["results"]] == [str(made[3].pk), str(made[2].pk)]
    Job.objects.filter(pk=made[3].pk).update(status="cancelled", finished_at=timezone.now())
    again = viewer.get("/jobs", limit=2, queue="q-docs").json()
    assert again["results"][0]["status"] == "cancelled"  # the rows are read every time
    assert len(compiled) == 1
    later = viewer.client.get(first["next"], headers=viewer.headers).json()
    assert [j["id"] for j in later["results"]] == [str(made[0].pk)]
    assert len(compiled) == 2  # another page, another statement
    nothing = viewer.get("/jobs", limit=2, queue="no-such-queue").json()
    assert nothing["results"] == [] and nothing["next"] is None


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_page_and_its_limits_are_one_round_trip(api_for, settings):
    """The read limits travel with the page (one query string); a page past them is a 503
    and the limits end with it."""
    if connection.vendor != "postgresql":
        pytest.skip("read limits are PostgreSQL's")
    from django.test.utils import CaptureQueriesContext

    viewer = api_for("viewer")
    _make_jobs()
    viewer.get("/jobs", limit=2)  # the count, kept from here (cheap counts are not: 4 rows)
    with CaptureQueriesContext(connection) as queries:
        body = viewer.get("/jobs", limit=2, count="false").json()
    assert len(body["results"]) == 2
    reads = [q["sql"] for q in queries if "controlplane_job" in q["sql"]]
    assert len(reads) == 1 and reads[0].startswith("SELECT set_config('statement_timeout'")
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()[0]

    from jobs.selectors import jobs as job_selectors

    real = job_selectors._page_statement
    settings.CONTROLPLANE = {"DASHBOARD_STATEMENT_TIMEOUT_MS": 100}
    try:
        job_selectors._page_statement = lambda *args: (
            "SELECT now(), gen_random_uuid(), '{}'::text FROM pg_sleep(2)",
            (),
        )
        response = viewer.get("/jobs", limit=2, count="false")
    finally:
        job_selectors._page_statement = real
    assert response.status_code == 503
    assert "narrow the filters" in response.json()["message"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == before
    assert len(viewer.get("/jobs", limit=2).json()["results"]) == 2
