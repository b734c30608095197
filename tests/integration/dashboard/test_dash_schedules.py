"""The Schedules pages: the list, one schedule with its history, and the
operators' Pause, Resume, Run now and New schedule, each audited.

Schedules are made and fired through ``jobs.schedules`` (services and
``fire_due_schedules`` with a chosen ``now``), as the reaper and the API do.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs import audit
from jobs.models import OperatorAction, Schedule, ScheduleFire
from jobs.operations import operation, registry
from jobs.schedules.firing import fire_due_schedules
from jobs.schedules.services import create_schedule, pause_schedule, run_schedule_now
from tests.factories import (
    ECHO,
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    make_user,
    unique_queue,
)

pytestmark = pytest.mark.django_db

LIST = "/dashboard/schedules/"
NEW = "/dashboard/schedules/new/"


def page_of(schedule: Schedule, action: str = "") -> str:
    return f"{LIST}{schedule.pk}/" + (f"{action}/" if action else "")


def make(**values: Any) -> Schedule:
    """An ``dash.echo`` schedule on a queue of its own, every minute unless told."""
    values.setdefault("operation", ECHO)
    values.setdefault("queue", unique_queue("sched"))
    if "cron" not in values:
        values.setdefault("every_seconds", 60)
    return create_schedule(values)


def fresh(schedule: Schedule) -> Schedule:
    return Schedule.objects.get(pk=schedule.pk)


def actions_of(schedule: Schedule) -> list[tuple[str, str, str, str]]:
    """(action, username, target, reason) of the schedule's audit rows, oldest first."""
    rows = OperatorAction.objects.filter(filter__schedule=str(schedule.pk)).order_by("at", "id")
    return list(rows.values_list("action", "username", "target", "reason"))


@pytest.fixture
def vanishing_operation() -> Iterator[str]:
    name = f"dash.vanishing-{uuid.uuid4().hex[:6]}"
    operation(name)(lambda ctx, payload: None)
    yield name
    registry.unregister(name)


# --- reading -------------------------------------------------------------------


def test_the_list_shows_each_schedule_with_its_timing_fires_and_last_outcome(
    viewer_client: Client,
) -> None:
    nightly = make(name="nightly-report", cron="30 2 * * *", timezone="Europe/Berlin")
    poll = make(name="poll-crm", every_seconds=300)
    never = make(name="quiet", every_seconds=3600)
    pause_schedule(never.pk)
    job = run_schedule_now(nightly.pk)

    response = viewer_client.get(LIST)
    assert response.status_code == 200
    page = response.content.decode()
    assert '<a href="/dashboard/schedules/" aria-current="page">Schedules</a>' in page
    # One row per schedule, by name, linking to its page.
    names = [row.schedule.name for row in response.context["rows"]]
    assert names == ["nightly-report", "poll-crm", "quiet"]
    for schedule in (nightly, poll, never):
        assert f'href="{page_of(schedule)}"' in page
    assert "<code" in page and "30 2 * * *" in page and "Europe/Berlin" in page
    assert "every&nbsp;5\u00a0min" in page and "every&nbsp;1\u00a0h" in page
    # Next fire as an absolute UTC time the page turns relative; a paused one has none.
    assert f'<time datetime="{fresh(poll).next_fire_at.isoformat()}" data-rel' in page
    paused_row = page.split(f'data-schedule="{never.pk}"')[1].split("</tr>")[0]
    assert "paused" in paused_row and "data-rel" not in paused_row.split("next-fire")[1][:120]
    # The last outcome: the status badge of the job it fired, linked.
    row = page.split(f'data-schedule="{nightly.pk}"')[1].split("</tr>")[0]
    assert f'href="/dashboard/jobs/{job.pk}/"' in row
    assert '<span class="badge state-queued">queued</span>' in row
    assert f'<time datetime="{fresh(nightly).last_fire_at.isoformat()}"' in row
    assert '<span class="flag">api</span>' in row
    # A viewer sees no buttons and no form.
    assert "schedule-pause" not in page and "/pause/" not in page and "/run/" not in page
    assert "New schedule" not in page and 'action="/dashboard/schedules/new/"' not in page


def test_the_list_has_no_schedules_yet(viewer_client: Client) -> None:
    response = viewer_client.get(LIST)
    assert response.status_code == 200
    assert "No schedules yet." in response.content.decode()


def test_the_detail_page_shows_settings_payload_fires_and_history(
    viewer_client: Client, vanishing_operation: str
) -> None:
    schedule = make(
        name="sync",
        every_seconds=60,
        overlap="skip",
        payload={"account": 42, "region": "eu"},
        priority=7,
    )
    first = schedule.next_fire_at
    assert fire_due_schedules(first).fired == 1  # enqueued
    assert fire_due_schedules(first + timedelta(minutes=1)).skipped_overlap == 1
    ran = run_schedule_now(schedule.pk)  # run_now, whatever the overlap
    [slot_job] = [j for j in assert_enqueued(schedule=schedule, count=2) if j.pk != ran.pk]

    response = viewer_client.get(page_of(schedule))
    assert response.status_code == 200
    page = response.content.decode()
    assert "<h2>Settings</h2>" in page and "every&nbsp;1\u00a0min" in page
    assert "skip a fire while the previous run is queued or running" in page
    assert "<dd>7</dd>" in page and "catch up one" in page
    assert html.escape('"account": 42', quote=True) in page  # pretty JSON, escaped
    assert f'href="/dashboard/jobs/?schedule={schedule.pk}"' in page
    history = page.split('id="schedule-history"')[1]
    outcomes = [h.fire.outcome for h in response.context["history"]]
    # Newest fire time first: the two slots are in the future of the run now.
    assert outcomes == ["skipped_overlap", "enqueued", "run_now"]
    assert 'data-outcome="skipped_overlap"' in history and "flag-warn" in history
    assert history.count('<span class="badge state-queued">queued</span>') == 2
    for job in (ran, slot_job):
        assert f'href="/dashboard/jobs/{job.pk}/"' in history
    # No operator buttons for a viewer.
    assert "/run/" not in page and "/pause/" not in page and 'name="reason"' not in page

    # A fire enqueue refused shows as such, with no job.
    failing = make(name="gone", operation=vanishing_operation)
    registry.unregister(vanishing_operation)
    assert fire_due_schedules(failing.next_fire_at).failed == 1
    page = viewer_client.get(page_of(failing)).content.decode()
    assert 'data-outcome="enqueue_failed"' in page and "flag-bad" in page
    listed = viewer_client.get(LIST).content.decode()
    row = listed.split(f'data-schedule="{failing.pk}"')[1].split("</tr>")[0]
    assert "enqueue_failed" in row


def test_the_jobs_list_filters_by_schedule(viewer_client: Client) -> None:
    schedule = make(name="filtered")
    fired = run_schedule_now(schedule.pk)
    other = run_schedule_now(make(name="other").pk)

    response = viewer_client.get(f"/dashboard/jobs/?schedule={schedule.pk}")
    assert response.status_code == 200
    ids = [job.pk for job in response.context["jobs"]]
    assert ids == [fired.pk] and other.pk not in ids
    assert f'value="{schedule.pk}"' in response.content.decode()
    # A job's page links back to the schedule that fired it.
    job_page = viewer_client.get(f"/dashboard/jobs/{fired.pk}/").content.decode()
    assert f'href="{page_of(schedule)}"' in job_page
    # Not an id: reported beside the field, not applied, not a 500.
    response = viewer_client.get("/dashboard/jobs/?schedule=nope")
    assert response.status_code == 200
    assert response.context["filters"].errors["schedule"] == "The schedule must be a schedule id."
    assert {fired.pk, other.pk} <= {job.pk for job in response.context["jobs"]}


def test_unknown_or_malformed_ids_are_404(viewer_client: Client, operator_client: Client) -> None:
    missing = uuid.uuid4()
    assert viewer_client.get(f"{LIST}{missing}/").status_code == 404
    assert viewer_client.get(f"{LIST}not-a-uuid/").status_code == 404
    for verb in ("pause", "resume", "run"):
        assert operator_client.post(f"{LIST}{missing}/{verb}/").status_code == 404
        assert operator_client.post(f"{LIST}12345/{verb}/").status_code == 404
    assert not OperatorAction.objects.filter(action__startswith="schedule_").exists()


# --- acting -------------------------------------------------------------------


def test_operators_see_the_buttons(operator_client: Client) -> None:
    live = make(name="live")
    paused = make(name="resting")
    pause_schedule(paused.pk)
    page = operator_client.get(LIST).content.decode()
    assert f'action="{page_of(live, "pause")}"' in page
    assert f'action="{page_of(paused, "resume")}"' in page
    assert f'action="{page_of(live, "resume")}"' not in page
    assert f'action="{page_of(paused, "pause")}"' not in page
    for schedule in (live, paused):
        assert f'action="{page_of(schedule, "run")}"' in page
    assert page.count("csrfmiddlewaretoken") >= 4
    detail = operator_client.get(page_of(live)).content.decode()
    assert f'action="{page_of(live, "pause")}"' in detail
    assert 'name="reason"' in detail


def test_pause_and_resume_change_the_schedule_and_are_audited(operator_client: Client) -> None:
    schedule = make(name="toggle", every_seconds=60)
    response = operator_client.post(
        page_of(schedule, "pause"), {"reason": "vendor outage", "next": LIST}
    )
    assert response.status_code == 302 and response["Location"] == LIST
    assert fresh(schedule).paused is True
    # A paused schedule does not fire.
    assert fire_due_schedules(schedule.next_fire_at + timedelta(minutes=5)).fired == 0

    response = operator_client.post(page_of(schedule, "resume"), follow=True)
    assert response.redirect_chain == [(page_of(schedule), 302)]
    assert "resumed" in response.content.decode()
    resumed = fresh(schedule)
    assert resumed.paused is False and resumed.next_fire_at > timezone.now()
    user = response.context["user"].get_username()
    assert actions_of(schedule) == [
        (audit.SCHEDULE_CREATE, "anonymous", "toggle", ""),
        (audit.SCHEDULE_PAUSE, user, "toggle", "vendor outage"),
        (audit.SCHEDULE_RESUME, user, "toggle", ""),
    ]


def test_run_now_enqueues_a_job_linked_to_the_schedule(operator_client: Client) -> None:
    schedule = make(name="on-demand", payload={"n": 1})
    pause_schedule(schedule.pk)  # run now works on a paused schedule too
    response = operator_client.post(page_of(schedule, "run"), {"reason": "backfill"}, follow=True)
    assert response.status_code == 200
    [job] = assert_enqueued(ECHO, queue=schedule.queue, schedule=schedule, count=1)
    assert job.payload == {"n": 1}
    assert ScheduleFire.objects.get(schedule=schedule).outcome == "run_now"
    page = response.content.decode()
    assert "Schedule ran now" in page and f'href="/dashboard/jobs/{job.pk}/"' in page
    assert fresh(schedule).paused is True
    [entry] = OperatorAction.objects.filter(action=audit.SCHEDULE_RUN)
    assert (entry.target, entry.reason, entry.filter["job"]) == (
        "on-demand",
        "backfill",
        str(job.pk),
    )
    assert entry.user.get_username() == response.context["user"].get_username()


def test_run_now_that_enqueue_refuses_is_a_400_and_leaves_nothing(
    operator_client: Client, vanishing_operation: str
) -> None:
    schedule = make(name="orphaned", operation=vanishing_operation)
    registry.unregister(vanishing_operation)
    response = operator_client.post(page_of(schedule, "run"))
    assert response.status_code == 400
    assert vanishing_operation in response.content.decode()
    refute_enqueued(schedule=schedule)
    assert not ScheduleFire.objects.filter(schedule=schedule).exists()
    assert not OperatorAction.objects.filter(action=audit.SCHEDULE_RUN).exists()


def test_viewers_cannot_act(viewer_client: Client) -> None:
    schedule = make(name="guarded")
    for verb in ("pause", "resume", "run"):
        assert viewer_client.post(page_of(schedule, verb)).status_code == 403
    assert viewer_client.post(NEW, {"operation": ECHO, "every_seconds": "60"}).status_code == 403
    assert fresh(schedule).paused is False
    refute_enqueued(schedule=schedule)
    assert Schedule.objects.count() == 1
    assert [a[0] for a in actions_of(schedule)] == [audit.SCHEDULE_CREATE]


def test_actions_are_post_only(operator_client: Client) -> None:
    schedule = make(name="get-me")
    for verb in ("pause", "resume", "run"):
        assert operator_client.get(page_of(schedule, verb)).status_code == 405
    assert operator_client.get(NEW).status_code == 405
    assert fresh(schedule).paused is False


def test_actions_need_a_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    schedule = make(name="csrf")
    assert client.post(page_of(schedule, "pause")).status_code == 403
    assert client.post(page_of(schedule, "run")).status_code == 403
    assert client.post(NEW, {"operation": ECHO, "every_seconds": "60"}).status_code == 403
    assert fresh(schedule).paused is False
    refute_enqueued(schedule=schedule)
    assert Schedule.objects.count() == 1
    token = str(client.get(page_of(schedule)).context["csrf_token"])
    response = client.post(page_of(schedule, "pause"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert fresh(schedule).paused is True


def test_hostile_names_and_payloads_are_escaped(operator_client: Client) -> None:
    schedule = make(
        name=f"nightly {HOSTILE_SCRIPT}",
        queue=f"q{HOSTILE_IMG}",
        payload={"note": HOSTILE_SCRIPT, HOSTILE_IMG: 1},
    )
    job = run_schedule_now(schedule.pk)
    for url in (LIST, page_of(schedule), f"/dashboard/jobs/?schedule={schedule.pk}"):
        page = operator_client.get(url).content.decode()
        assert HOSTILE_SCRIPT not in page and HOSTILE_IMG not in page, url
        assert "&lt;img src=x onerror=" in page, url  # the queue's name
        if "/jobs/" not in url:
            assert "nightly &lt;script&gt;" in page, url
    response = operator_client.post(page_of(schedule, "pause"), follow=True)
    page = response.content.decode()
    assert HOSTILE_SCRIPT not in page and "&lt;script&gt;" in page  # the message too
    assert [j.pk for j in assert_enqueued(schedule=schedule)] == [job.pk]


def test_next_outside_the_site_is_ignored(operator_client: Client) -> None:
    schedule = make(name="redirects")
    response = operator_client.post(page_of(schedule, "pause"), {"next": "https://evil.example/"})
    assert response.status_code == 302 and response["Location"] == page_of(schedule)


# --- new schedule ---------------------------------------------------------------


def test_operators_create_a_schedule_from_the_form(operator_client: Client) -> None:
    page = operator_client.get(LIST).content.decode()
    assert 'action="/dashboard/schedules/new/"' in page
    assert f'<option value="{ECHO}">' in page  # registered operations to choose from
    queue = unique_queue("form")
    response = operator_client.post(
        NEW,
        {
            "operation": ECHO,
            "name": "from-the-form",
            "cron": "*/10 * * * *",
            "every_seconds": "",
            "timezone": "America/New_York",
            "payload": '{"team": "ops"}',
            "queue": queue,
            "priority": "3",
            "catch_up": "none",
            "overlap": "skip",
        },
    )
    schedule = Schedule.objects.get(name="from-the-form")
    assert response.status_code == 302 and response["Location"] == page_of(schedule)
    assert (schedule.cron, schedule.every_seconds, schedule.timezone) == (
        "*/10 * * * *",
        None,
        "America/New_York",
    )
    assert (schedule.payload, schedule.queue, schedule.priority) == ({"team": "ops"}, queue, 3)
    assert (schedule.catch_up, schedule.overlap, schedule.source) == ("none", "skip", "api")
    assert schedule.next_fire_at is not None
    [(action, username, _, _)] = actions_of(schedule)
    assert action == audit.SCHEDULE_CREATE and username.startswith("operator-")


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"cron": "61 * * * *"}, "cron", ""),
        ({"cron": "* * * * *", "every_seconds": "60"}, "cron", "not both"),
        ({}, "cron", "Give cron"),
        ({"every_seconds": "soon"}, "every_seconds", "number of seconds"),
        ({"every_seconds": "0.1"}, "every_seconds", "every_seconds must be from"),
        ({"every_seconds": "60", "payload": "{not json"}, "payload", "JSON object"),
        ({"every_seconds": "60", "payload": "[1, 2]"}, "payload", "JSON object"),
        ({"every_seconds": "60", "payload": '{"x": NaN}'}, "payload", "JSON object"),
        ({"every_seconds": "60", "timezone": "Mars/Olympus"}, "timezone", ""),
        ({"every_seconds": "60", "priority": "high"}, "priority", "whole number"),
        ({"every_seconds": "60", "priority": "1000"}, "priority", "from"),
        ({"every_seconds": "60", "operation": "no.such.op"}, "operation", "no.such.op"),
    ],
)
def test_a_refused_form_shows_its_errors_inline_and_creates_nothing(
    operator_client: Client, fields: dict[str, str], field: str, text: str
) -> None:
    data = {"operation": ECHO, "name": "refused", "payload": "", **fields}
    response = operator_client.post(NEW, data)
    assert response.status_code == 400
    form = response.context["form"]
    assert form.errors.get(field), form.errors
    assert text in " ".join(form.errors[field])
    page = response.content.decode()
    assert '<details class="schedule-new" open>' in page
    assert 'class="field-error"' in page and 'value="refused"' in page  # what was typed stays
    assert not Schedule.objects.exists()
    assert not OperatorAction.objects.exists()


def test_a_duplicate_name_is_refused_beside_the_name(operator_client: Client) -> None:
    make(name="taken")
    response = operator_client.post(
        NEW, {"operation": ECHO, "name": "taken", "every_seconds": "60"}
    )
    assert response.status_code == 400
    assert "already exists" in " ".join(response.context["form"].errors["name"])
    assert Schedule.objects.filter(name="taken").count() == 1


def test_a_hostile_payload_typed_into_the_form_is_echoed_escaped(operator_client: Client) -> None:
    response = operator_client.post(
        NEW, {"operation": ECHO, "cron": "bad", "payload": f'{{"x": "{HOSTILE_SCRIPT}"'}
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert HOSTILE_SCRIPT not in page and "&lt;script&gt;" in page
