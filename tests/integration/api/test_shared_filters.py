"""One filter vocabulary: the API, the ``jobs`` command and the dashboard's reader
accept the same names and spellings, including the ones only the dashboard had."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.http import QueryDict
from django.utils import timezone

from jobs.models import OperatorAction
from jobs.selectors import job_filters_from_query, read_job_filters
from tests.factories import ECHO, fresh, queued, unique_queue
from tests.integration.cli.conftest import run_jobs

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def ids(response) -> set[str]:
    assert response.status_code == 200, response.content
    return {row["id"] for row in response.json()["results"]}


def test_the_api_lists_by_payload_waiting_range_and_the_short_time_names(viewer) -> None:
    q = unique_queue()
    now = timezone.now()
    eu = queued(ECHO, {"account": 42, "region": "eu"}, queue=q)
    us = queued(ECHO, {"account": 7}, queue=q)
    later = queued(queue=q, run_after=now + timedelta(hours=1))
    assert ids(viewer.get("/jobs", queue=q, payload='{"account": 42}')) == {str(eu.pk)}
    assert ids(viewer.get("/jobs", queue=q, when="scheduled")) == {str(later.pk)}
    assert ids(viewer.get("/jobs", queue=q, range="1h")) == {str(eu.pk), str(us.pk), str(later.pk)}
    future = (now + timedelta(days=1)).isoformat()
    assert ids(viewer.get("/jobs", queue=q, **{"from": future})) == set()
    assert ids(viewer.get("/jobs", queue=q, to=future)) == {str(eu.pk), str(us.pk), str(later.pk)}
    refused = assert_error_shape(viewer.get("/jobs", when="someday"), 400)
    assert "scheduled or retrying" in str(refused)


def test_bulk_cancel_takes_a_payload_filter_in_its_body(operator) -> None:
    q = unique_queue()
    target, other = (
        queued(ECHO, {"tenant": "a"}, queue=q),
        queued(ECHO, {"tenant": "b"}, queue=q),
    )
    response = operator.post("/jobs/cancel", {"queue": q, "payload": {"tenant": "a"}})
    assert response.status_code == 200, response.content
    assert response.json() == {"changed": 1}
    assert (fresh(target).status, fresh(other).status) == ("cancelled", "queued")
    row = OperatorAction.objects.get(action="bulk_cancel")
    assert row.filter == {"queue": [q], "payload": {"tenant": "a"}}


def test_the_command_takes_the_same_names(db) -> None:
    q = unique_queue()
    target = queued(ECHO, {"n": 1}, queue=q)
    queued(ECHO, {"n": 2}, queue=q)
    run = run_jobs("cancel", "--queue", q, "--payload", '{"n": 1}', "--yes", "--by", "ops")
    assert run.code == 0, run
    assert fresh(target).status == "cancelled"
    bad = run_jobs("list", "--range", "3y")
    assert bad.code != 0 and "--range" in bad.err


def test_every_face_reads_one_filter_from_either_spelling() -> None:
    text = "queue=a,b&parent=none&created_after=2025-01-31T14:00&when=retrying&q=boom"
    strict = job_filters_from_query(QueryDict(text))
    lenient = read_job_filters(QueryDict(text))
    assert strict == lenient and not lenient.errors
    assert strict.queue == ("a", "b") and strict.top_level and strict.when == "retrying"
    again = read_job_filters(QueryDict(strict.querystring()))
    assert again == strict
    short = read_job_filters(QueryDict("queue=a&queue=b&from=2025-01-31T14:00"))
    assert short.queue == strict.queue and short.created_after == strict.created_after
