"""The schedules pages: every schedule, one schedule with its fire history, and the
operators' ``Pause``, ``Resume``, ``Run now`` and "New schedule".

Reads are ``jobs.schedules.selectors``', writes ``jobs.schedules.services``'
(the REST API's too), called with ``by=request.user`` so each action lands in
the operators' audit log. Each action redirects back with a message saying
what changed; an unknown schedule is a 404 and a refused one a 400 page, never
a 500. Plain pages: a schedule changes once per fire, so they do not update live.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.schedule_form import ScheduleForm, bind
from dashboard.views.common import action, base_context, page, refused
from jobs.exceptions import EnqueueError
from jobs.models import CatchUp, Job, Overlap, Schedule
from jobs.permissions import can_act
from jobs.schedules import services
from jobs.schedules.definitions import ScheduleInvalid
from jobs.schedules.firing import ENQUEUE_FAILED, RUN_NOW, SKIPPED_OVERLAP
from jobs.schedules.selectors import FireRow, last_outcome, schedule_get, schedule_history
from jobs.schedules.selectors import schedule_list as all_schedules
from jobs.selectors.operations import operation_list

# How a fire's outcome is flagged when it has no job to show the status of.
OUTCOME_FLAGS = {SKIPPED_OVERLAP: "flag-warn", ENQUEUE_FAILED: "flag-bad"}
OUTCOME_TITLES = {
    SKIPPED_OVERLAP: "Not enqueued: the previous run was still queued or running",
    ENQUEUE_FAILED: "Not enqueued: enqueue refused the job (see the reaper's log)",
    RUN_NOW: "Fired by an operator's Run now",
}


def every_text(seconds: float | None) -> str:
    """An interval as people say it: ``30 s``, ``15 min``, ``2 h``, ``1 d``, ``90.5 s``.

    The space is a no-break space, so a table cell never splits the number from its unit.
    """
    if seconds is None:
        return ""
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}\u00a0{unit}"
    return f"{seconds:g}\u00a0s"


@dataclass(frozen=True)
class Outcome:
    """What a fire (or a schedule's newest fire) came to: its job's status, else its outcome."""

    text: str
    job: uuid.UUID | None = None
    job_status: str | None = None

    @property
    def flag(self) -> str:
        return OUTCOME_FLAGS.get(self.text, "")

    @property
    def title(self) -> str:
        return OUTCOME_TITLES.get(self.text, "")


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as the pages show it; plain values, the templates escape them."""

    schedule: Schedule
    outcome: Outcome | None

    @property
    def every(self) -> str:
        return every_text(self.schedule.every_seconds)

    @classmethod
    def of(cls, schedule: Schedule) -> ScheduleRow:
        text = last_outcome(schedule)
        job = getattr(schedule, "last_job", None)
        status = getattr(schedule, "last_job_status", None)
        return cls(schedule, Outcome(text, job, status) if text else None)


@dataclass(frozen=True)
class HistoryRow:
    fire: FireRow
    outcome: Outcome


def _history(schedule: Schedule) -> list[HistoryRow]:
    return [
        HistoryRow(row, Outcome(row.outcome, row.job, row.job_status))
        for row in schedule_history(schedule.pk)
    ]


def _render_list(
    request: HttpRequest, form: ScheduleForm | None = None, *, status: int = 200
) -> HttpResponse:
    acting = can_act(request.user)
    context = {
        **base_context(request, "schedules"),
        "rows": [ScheduleRow.of(s) for s in all_schedules()],
        "form": (form or ScheduleForm.blank()) if acting else None,
        "operations": [info.name for info in operation_list()] if acting else [],
        "catch_ups": CatchUp.values,
        "overlaps": Overlap.values,
        "here": reverse("dashboard:schedules"),
    }
    return render(request, "dashboard/schedules.html", context, status=status)


@page
def schedule_list(request: HttpRequest) -> HttpResponse:
    return _render_list(request)


@page
def schedule_page(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    schedule = schedule_get(schedule_id)
    if schedule is None:
        raise Http404("No such schedule.")
    here = reverse("dashboard:schedule", args=[schedule.pk])
    context = {
        **base_context(request, "schedules"),
        "row": ScheduleRow.of(schedule),
        "s": schedule,
        "history": _history(schedule),
        "jobs_url": f"{reverse('dashboard:jobs')}?schedule={schedule.pk}",
        "here": here,
    }
    return render(request, "dashboard/schedule_detail.html", context)


# --- actions -------------------------------------------------------------------


def _back(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponseRedirect:
    """To ``next`` when it is on this site, else the schedule's page."""
    target = request.POST.get("next", "")
    if not target or not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}
    ):
        target = reverse("dashboard:schedule", args=[schedule_id])
    return HttpResponseRedirect(target)


def _reason(request: HttpRequest) -> str:
    return request.POST.get("reason", "").strip()[:2000]


def _problems(error: EnqueueError | ScheduleInvalid) -> list[str]:
    found = [f"{name}: {text}" for name, texts in error.errors.items() for text in texts]
    return found or [str(error)]


@action
def pause(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    try:
        schedule = services.pause_schedule(schedule_id, by=request.user, reason=_reason(request))
    except services.ScheduleNotFound:
        raise Http404("No such schedule.") from None
    messages.success(request, f"Schedule {schedule.name} paused: it fires no more until resumed.")
    return _back(request, schedule_id)


@action
def resume(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    try:
        schedule = services.resume_schedule(schedule_id, by=request.user, reason=_reason(request))
    except services.ScheduleNotFound:
        raise Http404("No such schedule.") from None
    messages.success(
        request, f"Schedule {schedule.name} resumed: it fires from its next slot after now."
    )
    return _back(request, schedule_id)


@action
def run_now(request: HttpRequest, schedule_id: uuid.UUID) -> HttpResponse:
    """Fire once now (paused or not); a job enqueue refuses is a 400 and leaves nothing."""
    try:
        job = services.run_schedule_now(schedule_id, by=request.user, reason=_reason(request))
    except services.ScheduleNotFound:
        raise Http404("No such schedule.") from None
    except (EnqueueError, ScheduleInvalid) as error:
        return refused(
            request,
            _problems(error),
            heading="The schedule could not run now",
            back=reverse("dashboard:schedule", args=[schedule_id]),
        )
    short = str(job.pk)
    kind = "job" if isinstance(job, Job) else "workflow"
    messages.success(request, f"Schedule ran now: {kind} {short[:8]}…{short[-6:]} is {job.status}.")
    return _back(request, schedule_id)


@action
def create(request: HttpRequest) -> HttpResponse:
    """The "New schedule" form: its schedule's page on success, else the form again (400)."""
    form, values = bind(request.POST)
    if values is not None:
        try:
            schedule = services.create_schedule(values, by=request.user)
        except ScheduleInvalid as error:
            form.add_all(error.errors)
        else:
            messages.success(request, f"Schedule {schedule.name} created.")
            return HttpResponseRedirect(reverse("dashboard:schedule", args=[schedule.pk]))
    messages.error(request, "The schedule was not created: fix the fields marked below.")
    return _render_list(request, form, status=400)
