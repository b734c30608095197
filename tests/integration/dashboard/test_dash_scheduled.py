"""Scheduled and retrying jobs on the dashboard: their views and badges, Run now and Discard."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.utils import timezone

from jobs import audit
from jobs.batches import dispatch_batches
from jobs.claims import claim_jobs
from jobs.clock import db_now
from jobs.models import BatchMessage, Job, JobEvent, OperatorAction
from jobs.rescheduling import NotWaiting, run_job_now
from jobs.transitions import fail_job, retry_job_later
from tests.factories import (
    assert_consistent,
    cancelled,
    claim,
    context,
    failed,
    fresh,
    make_user,
    queued,
    running,
    succeeded,
)

pytestmark = pytest.mark.django_db

LATER = timedelta(hours=2)


def messages_of(response) -> str:
    return " | ".join(str(m) for m in get_messages(response.wsgi_request))


def operator_name(client: Client) -> str:
    return client.get("/dashboard/").context["user"].get_username()


def scheduled(**options):
    return queued(run_after=timezone.now() + LATER, **options)


def retrying_after_failure(**options):
    """Ran once, failed with attempts left: queued again with a backoff (attempts = 1)."""
    job, held = running(max_attempts=3, **options)
    status = fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="Flaky",
        error_message="try again",
        retryable=True,
        backoff_seconds=LATER.total_seconds(),
    )
    assert status == "queued"
    return fresh(job)


def retrying_later(**options):
    """The ``retry_later`` diagnostic's path: RetryLaterError gives the attempt back."""
    job, held = running("retry_later", {"times": 1, "delay": 3600}, **options)
    retry_job_later(job.pk, lease_token=held.lease_token, reason="not yet", delay_seconds=3600)
    job = fresh(job)
    assert (job.status, job.attempts) == ("queued", 0)  # the counter alone cannot tell
    return job


def listed(client: Client, query: str) -> set:
    response = client.get(f"/dashboard/jobs/?{query}")
    assert response.status_code == 200
    return {job.pk for job in response.context["jobs"]}


# --- the views and the badges -------------------------------------------------------


def test_scheduled_and_retrying_views_split_the_queued_jobs(viewer_client: Client) -> None:
    later = scheduled()
    backoff = retrying_after_failure()
    asked_later = retrying_later()
    due = queued()
    done = succeeded()
    everything = listed(viewer_client, "")
    assert {later.pk, backoff.pk, asked_later.pk, due.pk, done.pk} <= everything
    assert listed(viewer_client, "when=scheduled") == {later.pk}
    assert listed(viewer_client, "when=retrying") == {backoff.pk, asked_later.pk}
    # The views narrow the other filters, not replace them.
    assert listed(viewer_client, f"when=retrying&queue={backoff.queue}") == {backoff.pk}
    assert listed(viewer_client, "when=scheduled&status=failed") == set()


def test_a_scheduled_job_that_became_due_is_plain_queued(viewer_client: Client) -> None:
    job = queued(run_after=timezone.now() + timedelta(milliseconds=1))
    assert listed(viewer_client, "when=scheduled") <= {job.pk}
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    assert listed(viewer_client, "when=scheduled") == set()
    assert listed(viewer_client, "when=retrying") == set()


def test_an_unknown_view_is_reported_and_not_applied(viewer_client: Client) -> None:
    job = queued()
    response = viewer_client.get("/dashboard/jobs/?when=someday")
    assert response.status_code == 200
    assert "scheduled or retrying" in response.context["filters"].errors["when"]
    assert job.pk in {j.pk for j in response.context["jobs"]}


def test_list_has_the_view_links_and_badges(viewer_client: Client) -> None:
    later = scheduled()
    backoff = retrying_after_failure()
    html = viewer_client.get("/dashboard/jobs/").content.decode()
    assert 'href="/dashboard/jobs/?when=scheduled"' in html
    assert 'href="/dashboard/jobs/?when=retrying"' in html
    row = html[html.index(f'id="job-{later.pk}"') :]
    assert ">scheduled</span>" in row[: row.index("</tr>")]
    assert later.run_after.isoformat() in row[: row.index("</tr>")]
    row = html[html.index(f'id="job-{backoff.pk}"') :]
    assert "retrying (attempt 2 of 3)" in row[: row.index("</tr>")]


def test_the_view_tab_keeps_the_other_filters(viewer_client: Client) -> None:
    html = viewer_client.get("/dashboard/jobs/?queue=billing&when=retrying").content.decode()
    assert 'href="/dashboard/jobs/?when=scheduled&amp;queue=billing"' in html
    assert 'aria-current="page" href="/dashboard/jobs/?when=retrying&amp;queue=billing"' in html


def test_job_page_badges(viewer_client: Client) -> None:
    html = viewer_client.get(f"/dashboard/jobs/{scheduled().pk}/").content.decode()
    assert ">scheduled</span>" in html and "runs <time" in html
    html = viewer_client.get(f"/dashboard/jobs/{retrying_later().pk}/").content.decode()
    assert "retrying (attempt 1 of 1)" in html
    html = viewer_client.get(f"/dashboard/jobs/{queued().pk}/").content.decode()
    assert 'class="badge state-queued">queued</span>' in html


def test_buttons_show_for_operators_only(operator_client: Client, viewer_client: Client) -> None:
    later, done, live = scheduled(), succeeded(), queued()
    page = operator_client.get(f"/dashboard/jobs/{later.pk}/").content.decode()
    assert ">Run now</button>" in page and ">Cancel</button>" in page
    assert ">Discard</button>" not in page
    page = operator_client.get(f"/dashboard/jobs/{done.pk}/").content.decode()
    assert ">Discard</button>" in page and ">Run now</button>" not in page
    page = operator_client.get(f"/dashboard/jobs/{live.pk}/").content.decode()
    assert ">Run now</button>" not in page and ">Discard</button>" not in page
    for job in (later, done):
        page = viewer_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
        assert ">Run now</button>" not in page and ">Discard</button>" not in page


# --- Run now ------------------------------------------------------------------------------


def test_run_now_makes_a_scheduled_job_claimable(operator_client: Client) -> None:
    job = scheduled()
    assert claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30) == []
    before = db_now()  # the clock run-now stamps with (a reading that may lag this host's)
    response = operator_client.post(
        f"/dashboard/jobs/{job.pk}/run-now/", {"reason": "customer waiting"}, follow=True
    )
    assert "may run now" in messages_of(response)
    row = fresh(job)
    assert row.status == "queued" and before <= row.run_after <= timezone.now()
    event = JobEvent.objects.get(job=job, event="job.run_now")
    assert event.fields["by"] == operator_name(operator_client)
    assert event.fields["reason"] == "customer waiting"
    assert event.fields["was_due"] == job.run_after.isoformat()
    assert_consistent(job)
    entry = OperatorAction.objects.get(action=audit.RUN_NOW)
    assert (entry.target, entry.count, entry.reason) == (str(job.pk), 1, "customer waiting")
    claim(job)  # a worker picks it up now


def test_run_now_brings_a_retry_forward(operator_client: Client) -> None:
    job = retrying_after_failure()
    operator_client.post(f"/dashboard/jobs/{job.pk}/run-now/")
    row = fresh(job)
    assert row.run_after <= timezone.now() and row.attempts == 1
    assert JobEvent.objects.filter(job=job, event="job.run_now").count() == 1


def test_run_now_on_a_job_that_is_not_waiting_changes_nothing(operator_client: Client) -> None:
    for job in (queued(), running()[0], failed()):
        seq = fresh(job).last_event_seq
        response = operator_client.post(f"/dashboard/jobs/{job.pk}/run-now/", follow=True)
        assert "not waiting for a later time" in messages_of(response)
        assert fresh(job).last_event_seq == seq
    counts = OperatorAction.objects.filter(action=audit.RUN_NOW).values_list("count", flat=True)
    assert list(counts) == [0, 0, 0]


def test_run_job_now_refuses_with_a_clear_error() -> None:
    job, _ = running()
    with pytest.raises(NotWaiting, match="it is running"):
        run_job_now(job.pk, by="alice")
    assert not JobEvent.objects.filter(job=job, event="job.run_now").exists()


def test_viewers_and_get_requests_cannot_act(viewer_client: Client, operator_client) -> None:
    later, done = scheduled(), succeeded()
    assert viewer_client.post(f"/dashboard/jobs/{later.pk}/run-now/").status_code == 403
    assert viewer_client.post(f"/dashboard/jobs/{done.pk}/discard/").status_code == 403
    assert operator_client.get(f"/dashboard/jobs/{later.pk}/run-now/").status_code == 405
    assert operator_client.get(f"/dashboard/jobs/{done.pk}/discard/").status_code == 405
    assert fresh(later).run_after == later.run_after
    assert Job.objects.filter(pk=done.pk).exists()
    assert not OperatorAction.objects.exists()


def test_actions_need_the_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    later, done = scheduled(), succeeded()
    assert client.post(f"/dashboard/jobs/{later.pk}/run-now/").status_code == 403
    assert client.post(f"/dashboard/jobs/{done.pk}/discard/").status_code == 403
    assert fresh(later).run_after == later.run_after
    assert Job.objects.filter(pk=done.pk).exists()


def test_unknown_job_is_404(operator_client: Client) -> None:
    missing = "00000000-0000-0000-0000-000000000000"
    assert operator_client.post(f"/dashboard/jobs/{missing}/run-now/").status_code == 404
    assert operator_client.post(f"/dashboard/jobs/{missing}/discard/").status_code == 404


# --- Discard -------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [succeeded, failed, cancelled])
def test_discard_deletes_a_finished_job(operator_client: Client, make) -> None:
    job = make()
    response = operator_client.post(
        f"/dashboard/jobs/{job.pk}/discard/", {"reason": "test data"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/dashboard/jobs/"
    assert f"Job {str(job.pk)[:8]} discarded." in messages_of(response)
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not JobEvent.objects.filter(job_id=job.pk).exists()
    entry = OperatorAction.objects.get(action=audit.DISCARD)
    assert (entry.target, entry.count, entry.reason) == (str(job.pk), 1, "test data")
    status = make.__name__  # the helpers are named after the state they leave the job in
    assert entry.filter == {
        "operation": job.operation,
        "status": status,
        "queue": job.queue,
        "descendants": 0,
    }
    # The queues page lists it with what the job was.
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert "Discarded" in html and f"{job.operation} {status}" in html


@pytest.mark.parametrize("state", ["queued", "running"])
def test_discard_refuses_unfinished_jobs(operator_client: Client, state: str) -> None:
    job = queued() if state == "queued" else running()[0]
    response = operator_client.post(f"/dashboard/jobs/{job.pk}/discard/", follow=True)
    assert response.redirect_chain[-1][0] == f"/dashboard/jobs/{job.pk}/"
    assert f"Only a finished job can be discarded; this one is {state}." in messages_of(response)
    assert fresh(job).status == state
    entry = OperatorAction.objects.get(action=audit.DISCARD)
    assert entry.count == 0 and "refused" in entry.filter


def test_discard_takes_finished_descendants_and_batch_rows_along(operator_client: Client) -> None:
    parent, held = running("fanout", {"batches": 2})
    dispatch_batches(context(held), operation="fanout.batch", payloads=[{"index": 0}])
    child = succeeded(parent=parent.pk)
    grandchild = failed(parent=child.pk)
    fail_job(parent.pk, lease_token=held.lease_token, error_code="Boom", error_message="boom")
    assert BatchMessage.objects.filter(parent_id=parent.pk).exists()
    response = operator_client.post(f"/dashboard/jobs/{parent.pk}/discard/", follow=True)
    assert "discarded with 2 descendants." in messages_of(response)
    gone = [parent.pk, child.pk, grandchild.pk]
    assert not Job.objects.filter(pk__in=gone).exists()
    assert not JobEvent.objects.filter(job_id__in=gone).exists()
    assert not BatchMessage.objects.filter(parent_id=parent.pk).exists()
    assert OperatorAction.objects.get(action=audit.DISCARD).count == 3


def test_discard_refuses_a_parent_with_unfinished_descendants(operator_client: Client) -> None:
    parent = succeeded()
    child = succeeded(parent=parent.pk)
    grandchild = queued(parent=child.pk)
    response = operator_client.post(f"/dashboard/jobs/{parent.pk}/discard/", follow=True)
    assert "1 job below this one is not finished" in messages_of(response)
    assert Job.objects.filter(pk__in=[parent.pk, child.pk, grandchild.pk]).count() == 3
    assert OperatorAction.objects.get(action=audit.DISCARD).count == 0
