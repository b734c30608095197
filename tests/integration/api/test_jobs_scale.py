"""GET /jobs at scale (count once, reads under a statement timeout, a clean 503)
and POST /jobs idempotency when two requests race for one key."""

from __future__ import annotations

import threading
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test import Client

from django_controlplane.api import views
from jobs import selectors
from jobs.models import Job
from tests.factories import queued

from .conftest import assert_error_shape

# --- counting ---------------------------------------------------------------------


@pytest.mark.django_db
def test_count_on_the_first_page_only_unless_asked(viewer):
    for _ in range(5):
        queued()
    first = viewer.get("/jobs", limit=2).json()
    assert first["count"] == 5 and first["count_capped"] is False
    cursor = parse_qs(urlsplit(first["next"]).query)["cursor"][0]
    later = viewer.get("/jobs", limit=2, cursor=cursor).json()
    assert later["count"] is None and later["count_capped"] is False
    assert later["count_estimate"] is None and len(later["results"]) == 2
    asked = viewer.get("/jobs", limit=2, cursor=cursor, count="true").json()
    assert asked["count"] == 5
    skipped = viewer.get("/jobs", limit=2, count="false").json()
    assert skipped["count"] is None and len(skipped["results"]) == 2
    error = assert_error_shape(viewer.get("/jobs", count="maybe"), 400)
    assert "count" in error["errors"]


# --- the statement timeout ----------------------------------------------------------


def _statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_a_list_read_past_the_statement_timeout_is_a_clean_503(viewer, settings, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no statement timeout")
    settings.CONTROLPLANE = {"DASHBOARD_STATEMENT_TIMEOUT_MS": 100}
    queued()
    real = selectors.job_list

    def slow(*args, **kwargs):
        # Stands in for a filter no index serves on a big table.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(2)")
        return real(*args, **kwargs)

    monkeypatch.setattr(selectors, "job_list", slow)
    before = _statement_timeout()
    error = assert_error_shape(viewer.get("/jobs"), 503)
    assert "narrow" in error["message"]
    monkeypatch.setattr(selectors, "job_list", real)
    assert _statement_timeout() == before  # SET LOCAL ended with the read transaction
    assert len(viewer.get("/jobs").json()["results"]) == 1  # the connection is still fine


@pytest.mark.django_db
def test_an_unindexed_text_filter_over_many_rows_hits_the_timeout(viewer, settings):
    """Real rows, a real seq scan: ``q`` with no match over 300,000 jobs takes longer than 5 ms."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no statement timeout")
    seed = queued()
    columns = [f.column for f in Job._meta.concrete_fields]
    picks = [
        "gen_random_uuid()" if c == "id" else "NULL" if c == "unique_key" else c for c in columns
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO controlplane_job ({', '.join(columns)}) SELECT {', '.join(picks)} "
            "FROM controlplane_job, generate_series(1, 300000) WHERE controlplane_job.id = %s",
            [seed.pk],
        )
    settings.CONTROLPLANE = {"DASHBOARD_STATEMENT_TIMEOUT_MS": 5}
    error = assert_error_shape(viewer.get("/jobs", q="no-such-text-anywhere"), 503)
    assert "index-backed" in error["message"]
    settings.CONTROLPLANE = {}
    # The index-backed first page is unaffected by the table's size.
    assert len(viewer.get("/jobs", limit=10, count="false").json()["results"]) == 10


# --- idempotency under a race ----------------------------------------------------------


@pytest.mark.django_db
def test_a_repeat_that_loses_the_race_after_the_check_gets_200_and_the_first_job(
    operator, monkeypatch
):
    real = views.enqueue
    winner: list[Job] = []

    def racing(operation, payload, **options):
        # The other request commits between this request's check and its insert.
        if not winner:
            winner.append(real(operation, dict(payload), **options))
        return real(operation, payload, **options)

    monkeypatch.setattr(views, "enqueue", racing)
    response = operator.post("/jobs", {"operation": "ping", "idempotency_key": "race"})
    assert response.status_code == 200, response.content
    assert response.json()["id"] == str(winner[0].pk)
    assert Job.objects.filter(unique_key="race").count() == 1
    fresh = operator.post("/jobs", {"operation": "ping", "idempotency_key": "other"})
    assert fresh.status_code == 201  # no race: still 201


@pytest.mark.django_db(transaction=True)
def test_concurrent_repeats_get_one_201_and_the_rest_200_with_the_same_job(api_for):
    operator = api_for("operator")
    clients = 4
    start = threading.Barrier(clients)
    answers: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def post() -> None:
        try:
            client = Client()
            start.wait(timeout=10)
            response = client.post(
                "/jobs",
                {"operation": "ping", "idempotency_key": "together"},
                content_type="application/json",
                headers=operator.headers,
            )
            answers.append((response.status_code, response.json().get("id", "")))
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    statuses = sorted(code for code, _ in answers)
    assert statuses == [200] * (clients - 1) + [201], answers
    assert len({job_id for _, job_id in answers}) == 1
    assert Job.objects.filter(unique_key="together").count() == 1
