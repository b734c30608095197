"""The Django admin: every page opens, jobs stay read-only, actions go through the transitions,
and the job list stays cheap on a big table."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_controlplane.admin import EVENTS_SHOWN
from jobs import operator_actions
from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job, JobEvent, OperatorAction, Queue, Worker
from jobs.transitions import emit_event
from tests.factories import (
    ECHO,
    cancelled,
    failed,
    fresh,
    queued,
    running,
    succeeded,
    tick,
    worker,
)


def url(model: type[Model], view: str, *args: Any) -> str:
    """An admin URL from the model's own label (the app label is being renamed)."""
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def messages_of(response) -> str:
    return " | ".join(str(m) for m in get_messages(response.wsgi_request))


def username(client: Client) -> str:
    return client.get(reverse("admin:index")).wsgi_request.user.get_username()


def run_action(client: Client, action: str, jobs: list[Job], **extra: str):
    data = {"action": action, "_selected_action": [str(j.pk) for j in jobs], "index": "0"}
    return client.post(url(Job, "changelist"), {**data, **extra}, follow=True)


def some_of_everything() -> dict[str, Model]:
    """A job in each state (one with a child and a gone worker), a worker, a queue, an audit row."""
    parent = queued(queue="admin-q")
    queued(parent=parent.pk, queue="admin-q")
    gone, _ = running(queue="admin-gone")
    Worker.objects.filter(pk=fresh(gone).worker_id).delete()  # no FK: the job keeps its id
    operator_actions.set_paused("admin-q", True, user=None)
    return {
        "parent": parent,
        "gone": gone,
        "failed": failed(),
        "succeeded": succeeded(),
        "cancelled": cancelled(),
        "worker": worker(),
        "queue": Queue.objects.get(name="admin-q"),
        "action": OperatorAction.objects.latest("at"),
    }


# --- every page opens ------------------------------------------------------------------


@pytest.mark.parametrize("role", ["superuser_client", "viewer_client"])
def test_every_list_and_page_opens(role: str, request) -> None:
    client: Client = request.getfixturevalue(role)
    rows = some_of_everything()
    index = client.get(reverse("admin:index"))
    assert index.status_code == 200
    for model in (Job, Worker, Queue, OperatorAction):
        assert url(model, "changelist") in index.content.decode()
        assert client.get(url(model, "changelist")).status_code == 200
    for row in rows.values():
        page = client.get(url(type(row), "change", row.pk))
        assert page.status_code == 200, row
    gone_page = client.get(url(Job, "change", rows["gone"].pk)).content.decode()
    assert f"{fresh(rows['gone']).worker_id} (gone)" in gone_page
    assert "?parent=" in client.get(url(Job, "change", rows["parent"].pk)).content.decode()


def test_job_filters_and_search_narrow_the_list(superuser_client: Client) -> None:
    a, b = queued(ECHO, {"account": 7}, queue="admin-a"), queued(queue="admin-b")
    done = succeeded(ECHO, queue="admin-a")
    child = queued(parent=a.pk, queue="admin-b")
    changelist = url(Job, "changelist")

    def listed(**params: str) -> set[Any]:
        response = superuser_client.get(changelist, params)
        assert response.status_code == 200, params
        return {job.pk for job in response.context["cl"].result_list}

    assert listed(status="succeeded") == {done.pk}
    assert listed(queue="admin-a") == {a.pk, done.pk}
    assert listed(queue="admin-a", status="queued") == {a.pk}
    assert listed(parent=str(a.pk)) == {child.pk}
    assert listed(q=str(b.pk)) == {b.pk}
    assert listed(q=b.pk.hex[:20]) == {b.pk}  # an id prefix
    assert listed(q=str(b.pk)[:23]) == {b.pk}  # with its dashes
    assert listed(q="admin-b") == {b.pk, child.pk}  # a queue
    assert listed(q="echo", status="succeeded") == {done.pk}  # part of the operation's name
    assert listed(q="no-such-thing") == set()
    # The dashboard's and the API's filter words, read by the same JobFilters.
    assert listed(parent="none", queue="admin-b") == {b.pk}
    assert listed(status="queued,succeeded", queue="admin-a") == {a.pk, done.pk}
    assert listed(range="1h", operation=ECHO) >= {done.pk}
    assert listed(payload='{"account": 7}') == {a.pk}
    for bad in ({"range": "2d"}, {"status": "lost"}, {"from": "yesterday"}, {"parent": "x"}):
        response = superuser_client.get(changelist, bad)  # the admin's "invalid lookup"
        assert response.status_code == 302 and response["Location"].endswith("?e=1"), bad
    filters = superuser_client.get(changelist).context["cl"].filter_specs
    choices = {spec.title: [c[0] for c in getattr(spec, "lookup_choices", [])] for spec in filters}
    assert "admin-a" not in choices["queue"]  # from Queue rows and operations, not from jobs
    assert ECHO in choices["operation"]


# --- read-only jobs --------------------------------------------------------------------


def test_jobs_and_events_cannot_be_edited_added_or_deleted(superuser_client: Client) -> None:
    job = queued()
    emit_event(job.pk, event="test.note")  # seq 2, stored (seq 1 is implied by the row)
    page = superuser_client.get(url(Job, "change", job.pk))
    assert page.context["has_change_permission"] is False
    assert 'name="_save"' not in page.content.decode()
    response = superuser_client.post(url(Job, "change", job.pk), {"priority": "100"})
    assert response.status_code == 403
    assert superuser_client.get(url(Job, "add")).status_code == 403
    assert superuser_client.post(url(Job, "delete", job.pk), {"post": "yes"}).status_code == 403
    assert fresh(job).priority == 0 and Job.objects.filter(pk=job.pk).exists()
    inline = page.context["inline_admin_formsets"][0]
    assert inline.has_add_permission is False and inline.has_delete_permission is False
    assert [f.instance.event for f in inline.formset.forms] == ["test.note"]


def test_the_events_inline_shows_only_the_last_events(viewer_client: Client) -> None:
    job, held = running()
    for n in range(EVENTS_SHOWN + 10):
        tick(job, held, n, EVENTS_SHOWN + 10)
    last = fresh(job).last_event_seq
    assert last == EVENTS_SHOWN + 12  # enqueued, started, the ticks
    with CaptureQueriesContext(connection) as ctx:
        page = viewer_client.get(url(Job, "change", job.pk))
    assert page.status_code == 200
    inline = page.context["inline_admin_formsets"][0]
    seqs = [form.instance.seq for form in inline.formset.forms]
    assert seqs == list(range(last - EVENTS_SHOWN + 1, last + 1))
    assert f"the last {EVENTS_SHOWN} of {last:,}" in page.content.decode()
    event_table = JobEvent._meta.db_table
    reads = [q["sql"] for q in ctx.captured_queries if f'FROM "{event_table}"' in q["sql"]]
    assert len(reads) == 1 and "LIMIT" in reads[0].upper(), reads


# --- cancel and retry ------------------------------------------------------------------


@pytest.mark.parametrize("role", ["superuser_client", "operator_client"])
def test_cancel_selected_jobs_writes_the_dashboards_events(role: str, request) -> None:
    client: Client = request.getfixturevalue(role)
    a, b = queued(), queued()
    kid = queued(parent=a.pk)
    done = succeeded()
    response = run_action(client, "cancel_jobs", [a, b, done])
    assert response.status_code == 200
    assert "Cancelled 3 jobs." in messages_of(response)  # a, b and a's child
    assert {fresh(j).status for j in (a, b, kid)} == {"cancelled"}
    assert fresh(done).status == "succeeded"
    by = username(client)
    event = JobEvent.objects.get(job=a, event="job.cancelled")
    assert event.fields == {"by": by}
    assert JobEvent.objects.get(job=kid, event="job.cancelled").fields == {
        "by": by,
        "cascade": True,
    }
    audit = OperatorAction.objects.get(action="bulk_cancel")
    assert audit.username == by and audit.count == 3
    assert set(audit.filter["ids"]) == {str(a.pk), str(b.pk)}


def test_retry_selected_jobs(operator_client: Client) -> None:
    jobs = [failed(), cancelled()]
    waiting = queued()
    response = run_action(operator_client, "retry_jobs", [*jobs, waiting])
    assert "Retried 2 jobs." in messages_of(response)
    assert [fresh(j).status for j in jobs] == ["queued", "queued"]
    by = username(operator_client)
    fields = JobEvent.objects.filter(event="job.retried").values_list("fields", flat=True)
    assert list(fields) == [{"by": by}, {"by": by}]
    assert OperatorAction.objects.get(action="bulk_retry").count == 2


def test_one_job_goes_the_job_pages_way(operator_client: Client) -> None:
    job = queued()
    response = operator_client.post(
        url(Job, "change", job.pk),
        {"CHANGE_FORM-action": "cancel_jobs", "_selected_action": str(job.pk)},
        follow=True,
    )
    assert "Cancelled 1 job." in messages_of(response)
    assert fresh(job).status == "cancelled"
    assert JobEvent.objects.get(job=job, event="job.cancelled").fields == {
        "by": username(operator_client)
    }
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.target, entry.count) == ("cancel", str(job.pk), 1)
    again = run_action(operator_client, "cancel_jobs", [job])
    assert "No job could be cancelled" in messages_of(again)
    assert OperatorAction.objects.filter(action="cancel", count=0).count() == 1


def test_select_across_acts_on_the_filter_up_to_the_cap(
    operator_client: Client, monkeypatch
) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "3")
    jobs = [queued(queue="admin-across") for _ in range(5)]
    other = queued()
    changelist = url(Job, "changelist") + "?queue=admin-across"
    data = {"action": "cancel_jobs", "_selected_action": [str(jobs[0].pk)], "index": "0"}
    response = operator_client.post(changelist, {**data, "select_across": "1"}, follow=True)
    assert "Cancelled 3 jobs. At most 3 change per run" in messages_of(response)
    statuses = [fresh(j).status for j in jobs]
    assert statuses == ["queued"] * 2 + ["cancelled"] * 3  # the newest first
    assert fresh(other).status == "queued"


def test_a_viewer_cannot_cancel_or_retry(viewer_client: Client) -> None:
    job, done = queued(), failed()
    listing = viewer_client.get(url(Job, "changelist"))
    assert listing.context["action_form"] is None
    page = viewer_client.get(url(Job, "change", job.pk))
    assert page.context["action_form"] is None
    assert run_action(viewer_client, "cancel_jobs", [job]).status_code == 200  # just the list
    run_action(viewer_client, "retry_jobs", [done])
    viewer_client.post(
        url(Job, "change", job.pk),
        {"CHANGE_FORM-action": "cancel_jobs", "_selected_action": str(job.pk)},
    )
    assert (fresh(job).status, fresh(done).status) == ("queued", "failed")
    assert not JobEvent.objects.filter(event__in=["job.cancelled", "job.retried"]).exists()
    assert not OperatorAction.objects.exists()


# --- queues ----------------------------------------------------------------------------


def test_queue_settings_go_through_the_audited_functions(operator_client: Client) -> None:
    operator_actions.set_paused("admin-settings", False, user=None)
    OperatorAction.objects.all().delete()
    change = url(Queue, "change", "admin-settings")
    form = {"kind": "job", "paused": "on", "concurrency_cap": "7"}
    response = operator_client.post(change, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    queue = Queue.objects.get(name="admin-settings")
    assert queue.paused and queue.concurrency_cap == 7
    entries = {e.action: e for e in OperatorAction.objects.all()}
    assert set(entries) == {"pause", "set_cap"}
    assert entries["set_cap"].filter == {"concurrency_cap": 7}
    assert entries["pause"].username == username(operator_client)
    response = operator_client.post(
        url(Queue, "changelist"),
        {"action": "resume_queues", "_selected_action": ["admin-settings"], "index": "0"},
        follow=True,
    )
    assert "Resumed 1 queue." in messages_of(response)
    assert not Queue.objects.get(name="admin-settings").paused
    assert OperatorAction.objects.filter(action="resume").count() == 1


def test_a_new_queue_row_is_audited_too(operator_client: Client) -> None:
    response = operator_client.post(
        url(Queue, "add"), {"name": "admin-new", "kind": "job", "paused": "on"}
    )
    assert response.status_code == 302
    assert Queue.objects.get(name="admin-new").paused
    actions = list(OperatorAction.objects.order_by("id").values_list("action", "target"))
    assert actions == [("admin_change", "admin-new"), ("pause", "admin-new")]
    assert OperatorAction.objects.get(action="admin_change").filter["created"] is True


def test_a_queue_kind_is_read_only_in_the_admin(operator_client: Client) -> None:
    operator_actions.set_paused("admin-kind", False, user=None)
    change = url(Queue, "change", "admin-kind")
    response = operator_client.post(change, {"kind": "batch", "paused": "on"})
    assert response.status_code == 302
    queue = Queue.objects.get(name="admin-kind")
    assert (queue.kind, queue.paused) == ("job", True)
    actions = OperatorAction.objects.order_by("id").values_list("action", flat=True)
    assert list(actions) == ["resume", "pause"]  # the kind was never part of the change


def test_a_running_jobs_lease_token_is_masked(superuser_client: Client) -> None:
    from tests.factories import running

    job, _ = running()
    page = superuser_client.get(url(Job, "change", job.pk)).content.decode()
    token = str(Job.objects.get(pk=job.pk).lease_token)
    assert token not in page and token[-4:] in page


def test_a_viewer_cannot_change_queues(viewer_client: Client) -> None:
    operator_actions.set_paused("admin-ro", False, user=None)
    change = url(Queue, "change", "admin-ro")
    assert viewer_client.get(change).context["has_change_permission"] is False
    assert viewer_client.post(change, {"kind": "job", "paused": "on"}).status_code == 403
    assert viewer_client.get(url(Queue, "add")).status_code == 403
    assert not Queue.objects.get(name="admin-ro").paused


def test_workers_and_the_audit_log_are_read_only(superuser_client: Client) -> None:
    w = worker()
    operator_actions.set_paused("admin-log", True, user=None)
    entry = OperatorAction.objects.get()
    for model, pk in ((Worker, w.pk), (OperatorAction, entry.pk)):
        assert (
            superuser_client.get(url(model, "change", pk)).context["has_change_permission"] is False
        )
        assert superuser_client.post(url(model, "delete", pk), {"post": "yes"}).status_code == 403
        assert superuser_client.get(url(model, "add")).status_code == 403
    assert Worker.objects.filter(pk=w.pk).exists() and OperatorAction.objects.exists()


# --- a big table -----------------------------------------------------------------------


def test_the_job_list_never_counts_the_whole_table(superuser_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "1000")
    enqueue_many([JobSpec(ECHO, {"n": n}, queue="admin-big") for n in range(3000)])
    table = Job._meta.db_table.upper()
    changelist = url(Job, "changelist")
    pages = [{}, {"status": "queued"}, {"queue": "admin-big"}, {"operation": ECHO}, {"q": "echo"}]
    for params in pages:
        with CaptureQueriesContext(connection) as ctx:
            response = superuser_client.get(changelist, params)
        assert response.status_code == 200, params
        cl = response.context["cl"]
        assert cl.result_count == 1000 and len(cl.result_list) == cl.list_per_page, params
        assert "More than 1,000 jobs match" in response.content.decode(), params
        counts = 0
        for query in ctx.captured_queries:
            sql = query["sql"].upper()
            if f'FROM "{table}"' in sql or f"FROM {table}" in sql:
                counts += "COUNT(" in sql
                assert "COUNT(" not in sql or "LIMIT 1001" in sql, sql
                assert "DISTINCT" not in sql, sql
                # Only the search reads text (the faces' one search, ``JobFilters.q``:
                # part of an error too), under the statement timeout like every page.
                assert "q" in params or ("LIKE '%" not in sql and "LIKE %S" not in sql), sql
        # The capped count, and no other (an unfiltered list may use reltuples instead).
        assert counts == 1 or (counts == 0 and not params), params


@pytest.fixture
def postgres(db) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL feature")


@pytest.mark.usefixtures("postgres")
def test_the_note_gives_the_planners_estimate(superuser_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "100")
    enqueue_many([JobSpec(ECHO, {}, queue="admin-est") for _ in range(2000)])
    with connection.cursor() as cursor:
        cursor.execute(f'ANALYZE "{Job._meta.db_table}"')
    page = superuser_client.get(url(Job, "changelist")).content.decode()
    assert "More than 100 jobs match (about 2,000 by estimate)" in page


@pytest.mark.usefixtures("postgres")
def test_a_locked_job_table_answers_503_not_a_hung_page(superuser_client: Client) -> None:
    from django.db import connections, transaction

    from jobs.independent import independent_connection

    with independent_connection() as other:
        try:
            with transaction.atomic(using=other), connections[other].cursor() as cursor:
                cursor.execute(f'LOCK TABLE "{Job._meta.db_table}" IN ACCESS EXCLUSIVE MODE')
                response = superuser_client.get(url(Job, "changelist"))
        finally:
            connections[other].close()
    assert response.status_code == 503
    assert superuser_client.get(url(Job, "changelist")).status_code == 200
