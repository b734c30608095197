"""The job list's filters, keyset pages and capped counts, on PostgreSQL and SQLite alike."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.http import QueryDict
from django.test import Client
from django.utils import timezone

from dashboard import selectors
from jobs.models import Job
from jobs.selectors import read_job_filters
from jobs.selectors.payload import json_contains
from tests.factories import ECHO, failed, queued, running, succeeded


def ids_of(filters: str) -> set:
    f = read_job_filters(QueryDict(filters))
    return set(f.apply(Job.objects.all()).values_list("pk", flat=True))


@pytest.fixture
def mix(db):
    q1, q2 = "orders", "emails"
    jobs = {
        "a42": queued(ECHO, {"account": 42, "region": "eu"}, queue=q1),
        "a42b": queued(ECHO, {"account": 42, "tags": ["x", "y"], "nested": {"k": 1}}, queue=q2),
        "a7": queued(ECHO, {"account": 7, "flag": True, "none": None}, queue=q1),
        "str": queued(ECHO, {"account": "42"}, queue=q1),
        "failed": failed(
            ECHO, {"account": 42}, queue=q1, code="TimeoutError", message="the upstream timed out"
        ),
        "ok": succeeded(ECHO, {}, queue=q2),
    }
    return jobs


def test_payload_containment(mix) -> None:
    assert ids_of('payload={"account": 42}') == {mix["a42"].pk, mix["a42b"].pk, mix["failed"].pk}
    assert ids_of('payload={"account": 42, "region": "eu"}') == {mix["a42"].pk}
    assert ids_of('payload={"account": "42"}') == {mix["str"].pk}
    assert ids_of('payload={"flag": true}') == {mix["a7"].pk}
    assert ids_of('payload={"nested": {"k": 1}}') == {mix["a42b"].pk}
    assert ids_of('payload={"none": null}') == {mix["a7"].pk}
    assert ids_of('payload={"missing": 1}') == set()


def test_invalid_payload_filter_is_reported_not_applied(mix) -> None:
    f = read_job_filters(QueryDict("payload=account:42"))
    assert "payload" in f.errors and f.payload is None
    assert f.apply(Job.objects.all()).count() == Job.objects.count()
    assert "payload" in read_job_filters(QueryDict("payload=[1]")).errors


def test_simple_filters(mix) -> None:
    assert ids_of("status=failed") == {mix["failed"].pk}
    assert ids_of("status=failed&status=succeeded") == {mix["failed"].pk, mix["ok"].pk}
    assert ids_of("queue=emails") == {mix["a42b"].pk, mix["ok"].pk}
    assert ids_of("operation=nope") == set()
    assert ids_of("q=TIMED OUT") == {mix["failed"].pk}
    assert ids_of("q=timeouterror") == {mix["failed"].pk}
    assert ids_of(f"q={mix['a7'].pk}") == {mix["a7"].pk}
    assert len(ids_of("range=1h")) == 6


def test_parent_and_time_filters(db) -> None:
    parent = queued()
    kid = queued(parent=parent.pk)
    old = queued()
    Job.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    assert ids_of(f"parent={parent.pk}") == {kid.pk}
    assert "parent" in read_job_filters(QueryDict("parent=nope")).errors
    assert old.pk not in ids_of("range=24h")
    day = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert ids_of(f"from={day}") == {parent.pk, kid.pk}
    assert ids_of(f"to={day}") == {old.pk}
    assert "from" in read_job_filters(QueryDict("from=yesterday")).errors


def test_python_matching_agrees_with_the_database(mix) -> None:
    cases = [
        "",
        "status=queued",
        "queue=orders",
        'payload={"account": 42}',
        'payload={"tags": ["y"]}',
        "q=upstream",
        "status=failed&queue=orders",
        'payload={"account": "42"}',
    ]
    rows = list(
        Job.objects.values(
            "id",
            "status",
            "queue",
            "operation",
            "parent_id",
            "created_at",
            "payload",
            "error_code",
            "error_message",
        )
    )
    for case in cases:
        f = read_job_filters(QueryDict(case))
        expected = {r["id"] for r in rows if f.matches(r)}
        if case == 'payload={"tags": ["y"]}':
            assert expected == {
                mix["a42b"].pk
            }  # SQLite compares nested values exactly; Python as PostgreSQL does
            continue
        assert expected == ids_of(case), case


def test_json_contains_is_postgres_containment() -> None:
    assert json_contains({"a": 1, "b": [1, 2]}, {"b": [2]})
    assert not json_contains({"a": 1}, {"a": True})
    assert not json_contains({"a": True}, {"a": 1})
    assert json_contains({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"c": 1}}})


def test_the_url_holds_the_filters(operator_client: Client, mix) -> None:
    response = operator_client.get(
        '/dashboard/jobs/?queue=orders&payload={"account": 42}&status=queued'
    )
    assert [j.pk for j in response.context["jobs"]] == [mix["a42"].pk]
    query = response.context["query"]
    assert "queue=orders" in query and "payload=" in query and "status=queued" in query
    assert f"?{query}".replace("&", "&amp;") in response.content.decode()  # bulk form keeps them


def test_keyset_pages_walk_both_ways_without_gaps(operator_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("DASHBOARD_PAGE_SIZE", "4")
    made = [queued(queue="paged") for _ in range(10)]
    now = timezone.now()
    for i, job in enumerate(made):  # distinct and equal timestamps both occur
        Job.objects.filter(pk=job.pk).update(created_at=now - timedelta(seconds=i // 2))
    seen, after, pages = [], "", []
    while True:
        response = operator_client.get(f"/dashboard/jobs/?queue=paged&after={after}")
        page = response.context["page"]
        pages.append(page)
        seen += [j.pk for j in page.jobs]
        if not page.next_cursor:
            break
        after = page.next_cursor
    assert len(seen) == 10 and len(set(seen)) == 10
    expected = list(
        Job.objects.filter(queue="paged")
        .order_by("-created_at", "-id")
        .values_list("pk", flat=True)
    )
    assert seen == expected
    back = operator_client.get(f"/dashboard/jobs/?queue=paged&before={pages[-1].prev_cursor}")
    assert [j.pk for j in back.context["page"].jobs] == expected[4:8]
    assert pages[0].prev_cursor is None


def test_bad_cursor_falls_back_to_the_first_page(operator_client: Client, db) -> None:
    queued()
    response = operator_client.get("/dashboard/jobs/?after=garbage!!")
    assert response.status_code == 200 and response.context["cursor_error"]


def test_counts_are_capped(operator_client: Client, db, monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "3")
    for _ in range(5):
        queued(queue="many")
    response = operator_client.get("/dashboard/jobs/count/?queue=many")
    assert str(response.context["total"]) == "3+"
    assert 'id="job-total"' in response.content.decode() and "3+" in response.content.decode()
    page = operator_client.get("/dashboard/jobs/?queue=many").content.decode()
    assert 'hx-get="/dashboard/jobs/count/?queue=many"' in page
    counts = selectors.queue_state_counts(["many"])["many"]
    assert str(counts["queued"]) == "3+" and counts["queued"].capped
    assert str(counts["failed"]) == "0"
    assert "3+" in operator_client.get("/dashboard/queues/").content.decode()


def test_list_live_endpoint_refreshes_rows_and_counts_new_jobs(operator_client: Client, db) -> None:
    from jobs.clock import db_now

    first, held = running(queue="live")
    newest = db_now().isoformat()  # the clock enqueue stamps created_at with
    queued(queue="live")
    queued(queue="other")
    url = f"/dashboard/jobs/live/?queue=live&ids={first.pk}&newest={newest}"
    html = operator_client.get(url.replace("+", "%2B")).content.decode()
    assert f'id="job-{first.pk}"' in html and "hx-swap-oob" in html
    assert "1 new job matches" in html


def test_short_ids_tell_jobs_of_the_same_minute_apart_and_find_them(viewer_client):
    from dashboard.templatetags.dash import short_id

    jobs = [queued(ECHO, {"n": n}) for n in range(20)]
    shorts = {short_id(job.pk) for job in jobs}
    assert len({str(job.pk)[:8] for job in jobs}) == 1  # the old 8-digit form: all alike
    assert len(shorts) == len(jobs)
    target = jobs[7]
    assert ids_of(f"q={short_id(target.pk)}") == {target.pk}
    assert ids_of(f"q={str(target.pk)[:8]}...{str(target.pk)[-6:]}") == {target.pk}
    page = viewer_client.get("/dashboard/jobs/").content.decode()
    assert short_id(target.pk) in page
