"""Operator actions through the views: single and bulk cancel/retry, queues, orphans."""

from __future__ import annotations

from django.contrib.messages import get_messages
from django.test import Client

from jobs.models import Job, JobEvent, Queue
from tests.factories import (
    ECHO,
    cancelled,
    failed,
    fresh,
    queued,
    running,
    succeeded,
    worker,
)


def messages_of(response) -> str:
    """Every message shown on the page the response ended on, as one text."""
    return " | ".join(str(m) for m in get_messages(response.wsgi_request))


def operator_name(client: Client) -> str:
    return client.get("/dashboard/").context["user"].get_username()


def test_cancel_writes_who_and_why(operator_client: Client) -> None:
    job = queued()
    response = operator_client.post(
        f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "wrong account"}, follow=True
    )
    assert fresh(job).status == "cancelled"
    assert "Job cancelled." in messages_of(response)
    event = JobEvent.objects.get(job=job, event="job.cancelled")
    assert event.fields == {"by": operator_name(operator_client), "reason": "wrong account"}
    again = operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", follow=True)
    assert "already ended" in messages_of(again)


def test_cancel_cascades_to_children(operator_client: Client) -> None:
    parent = queued()
    kid = queued(parent=parent.pk)
    operator_client.post(f"/dashboard/jobs/{parent.pk}/cancel/")
    assert fresh(kid).status == "cancelled"


def test_retry_a_failed_job(operator_client: Client) -> None:
    job = failed()
    operator_client.post(f"/dashboard/jobs/{job.pk}/retry/", {"reason": "fixed upstream"})
    job = fresh(job)
    assert job.status == "queued" and job.attempts == 0
    event = JobEvent.objects.get(job=job, event="job.retried")
    assert event.fields["reason"] == "fixed upstream" and event.fields["by"]
    response = operator_client.post(f"/dashboard/jobs/{job.pk}/retry/", follow=True)
    assert "Only failed or cancelled" in messages_of(response)


def test_bulk_on_a_selection_previews_then_runs(operator_client: Client) -> None:
    a, b = queued(), queued()
    done = succeeded()
    data = {"do": "cancel-selected", "ids": [a.pk, b.pk, done.pk]}
    preview = operator_client.post("/dashboard/jobs/bulk/", data)
    assert preview.status_code == 200
    plan = preview.context["plan"]
    assert plan.eligible.value == 2 and plan.considered.value == 3
    assert "Cancel 2 jobs" in preview.content.decode()
    assert fresh(a).status == "queued"  # nothing changed yet
    response = operator_client.post(
        "/dashboard/jobs/bulk/", {**data, "confirm": "1", "reason": "dupes"}, follow=True
    )
    assert "Cancelled 2 jobs." in messages_of(response)
    assert {fresh(a).status, fresh(b).status, fresh(done).status} == {"cancelled", "succeeded"}
    fields = list(JobEvent.objects.filter(event="job.cancelled").values_list("fields", flat=True))
    assert len(fields) == 2 and all(f["reason"] == "dupes" and f["by"] for f in fields)


def test_bulk_on_everything_matching_the_filter(operator_client: Client) -> None:
    hits = [failed(ECHO, {"account": 42}, queue="bulk") for _ in range(3)]
    cancelled(ECHO, {"account": 42}, queue="bulk")
    miss = failed(ECHO, {"account": 7}, queue="bulk")
    other_queue = failed(ECHO, {"account": 42}, queue="elsewhere")
    url = '/dashboard/jobs/bulk/?queue=bulk&payload={"account":42}'
    preview = operator_client.post(url, {"do": "retry-filter"})
    assert preview.context["plan"].eligible.value == 4
    response = operator_client.post(url, {"do": "retry-filter", "confirm": "1"}, follow=True)
    assert "Retried 4 jobs." in messages_of(response)
    assert response.redirect_chain[-1][0].startswith("/dashboard/jobs/?queue=bulk")
    assert all(fresh(j).status == "queued" for j in hits)
    assert fresh(miss).status == "failed" and fresh(other_queue).status == "failed"


def test_bulk_runs_at_most_count_cap_jobs(operator_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "3")
    for _ in range(5):
        queued(queue="capped")
    preview = operator_client.post("/dashboard/jobs/bulk/?queue=capped", {"do": "cancel-filter"})
    assert preview.context["plan"].truncated and "run it again" in preview.content.decode().lower()
    response = operator_client.post(
        "/dashboard/jobs/bulk/?queue=capped", {"do": "cancel-filter", "confirm": "1"}, follow=True
    )
    assert "Cancelled 3 jobs." in messages_of(response)
    assert Job.objects.filter(queue="capped", status="queued").count() == 2


def test_bulk_needs_a_selection_or_the_filter_scope(operator_client: Client) -> None:
    response = operator_client.post("/dashboard/jobs/bulk/", {"do": "cancel-selected"}, follow=True)
    assert "Select at least one job" in messages_of(response)
    response = operator_client.post("/dashboard/jobs/bulk/", {"do": "explode-filter"}, follow=True)
    assert "Choose Cancel or Retry" in messages_of(response)


def test_pause_resume_and_cap(operator_client: Client) -> None:
    job = queued(queue="jobs.batch")
    operator_client.post("/dashboard/queues/pause/", {"name": job.queue})
    queue = Queue.objects.get(name=job.queue)
    assert queue.paused and queue.kind == "batch"  # created with its default kind
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert ">Resume</button>" in html
    operator_client.post("/dashboard/queues/resume/", {"name": job.queue})
    assert not Queue.objects.get(name=job.queue).paused
    operator_client.post("/dashboard/queues/cap/", {"name": job.queue, "concurrency_cap": "5"})
    assert Queue.objects.get(name=job.queue).concurrency_cap == 5
    bad = operator_client.post(
        "/dashboard/queues/cap/", {"name": job.queue, "concurrency_cap": "-1"}, follow=True
    )
    assert "whole number" in messages_of(bad)
    operator_client.post("/dashboard/queues/cap/", {"name": job.queue, "concurrency_cap": ""})
    assert Queue.objects.get(name=job.queue).concurrency_cap is None


def test_requeue_an_orphan_but_not_a_live_workers_job(operator_client: Client) -> None:
    dead = worker(stale=True)
    alive = worker()
    orphan, _ = running(worker_id=dead.pk)
    busy, _ = running(worker_id=alive.pk)
    operator_client.post(f"/dashboard/jobs/{orphan.pk}/requeue/")
    orphan = fresh(orphan)
    assert orphan.status == "queued" and orphan.worker_id is None
    event = JobEvent.objects.get(job=orphan, event="job.requeued")
    assert "requeued by" in event.message
    response = operator_client.post(f"/dashboard/jobs/{busy.pk}/requeue/", follow=True)
    assert "no longer orphaned" in messages_of(response)
    assert fresh(busy).status == "running"


# --- the audit log ------------------------------------------------------------------


def audit_rows() -> list[tuple[str, str, int]]:
    from jobs.models import OperatorAction

    return list(OperatorAction.objects.order_by("id").values_list("action", "target", "count"))


def test_every_action_writes_one_audit_row(operator_client: Client) -> None:
    from jobs.models import OperatorAction

    name = operator_name(operator_client)
    job = queued(queue="audited")
    operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "typo"})
    operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/")  # nothing left to change
    operator_client.post(f"/dashboard/jobs/{job.pk}/retry/", {"reason": "fixed"})
    operator_client.post("/dashboard/queues/pause/", {"name": "audited"})
    operator_client.post("/dashboard/queues/resume/", {"name": "audited"})
    operator_client.post("/dashboard/queues/cap/", {"name": "audited", "concurrency_cap": "7"})
    orphan, _ = running(worker_id=worker(stale=True).pk)
    operator_client.post(f"/dashboard/jobs/{orphan.pk}/requeue/")
    assert audit_rows() == [
        ("cancel", str(job.pk), 1),
        ("cancel", str(job.pk), 0),
        ("retry", str(job.pk), 1),
        ("pause", "audited", 0),
        ("resume", "audited", 0),
        ("set_cap", "audited", 0),
        ("requeue_orphan", str(orphan.pk), 1),
    ]
    entries = list(OperatorAction.objects.order_by("id"))
    assert {e.username for e in entries} == {name}
    assert all(e.user is not None and e.user.get_username() == name for e in entries)
    assert (entries[0].reason, entries[2].reason) == ("typo", "fixed")
    assert entries[5].filter == {"concurrency_cap": 7}


def test_bulk_actions_record_the_count_and_the_filter(operator_client: Client) -> None:
    from jobs.models import OperatorAction

    for _ in range(3):
        failed(ECHO, {"account": 42}, queue="bulk-audit")
    failed(ECHO, {"account": 7}, queue="bulk-audit")
    url = '/dashboard/jobs/bulk/?queue=bulk-audit&status=failed&payload={"account":42}'
    operator_client.post(url, {"do": "retry-filter"})  # the preview changes nothing
    assert audit_rows() == []
    operator_client.post(url, {"do": "retry-filter", "confirm": "1", "reason": "outage over"})
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.target, entry.count, entry.reason) == (
        "bulk_retry",
        "filter",
        3,
        "outage over",
    )
    assert entry.filter == {
        "scope": "filter",
        "status": ["failed"],
        "queue": "bulk-audit",
        "payload": '{"account":42}',
    }
    picked = [queued(queue="bulk-audit") for _ in range(2)]
    operator_client.post(
        "/dashboard/jobs/bulk/",
        {"do": "cancel-selected", "confirm": "1", "ids": [str(j.pk) for j in picked]},
    )
    last = OperatorAction.objects.order_by("-id").first()
    assert (last.action, last.count, last.filter["scope"]) == ("bulk_cancel", 2, "selected")
    assert sorted(last.filter["ids"]) == sorted(str(j.pk) for j in picked)


def test_recent_operator_actions_are_shown_escaped(operator_client: Client, viewer_client) -> None:
    job = queued(queue="shown")
    operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "<b>loud</b>"})
    operator_client.post("/dashboard/queues/pause/", {"name": "shown"})
    html = viewer_client.get("/dashboard/queues/").content.decode()
    section = html[html.index('id="operator-actions"') :]
    assert "Recent operator actions" in html
    assert "Cancelled" in section and "Paused" in section
    assert operator_name(operator_client) in section
    assert "&lt;b&gt;loud&lt;/b&gt;" in section and "<b>loud</b>" not in section
    assert f'href="/dashboard/jobs/{job.pk}/"' in section


def test_orphan_requeue_names_the_operator_in_the_event(operator_client: Client) -> None:
    orphan, _ = running(worker_id=worker(stale=True).pk)
    operator_client.post(f"/dashboard/jobs/{orphan.pk}/requeue/")
    event = JobEvent.objects.get(job=orphan, event="job.requeued")
    assert event.fields["by"] == operator_name(operator_client)
