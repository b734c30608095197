"""Operator actions. Each view checks the role (``action``), calls one domain service
(``jobs.operator_actions``, ``jobs.bulk_actions``) and redirects back with a message
saying what changed."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.db import timeout_response
from dashboard.views.common import action, base_context, refused
from jobs import bulk_actions, operator_actions
from jobs.exceptions import JobNotFound
from jobs.queue_limits import LimitError, check_cap, parse_rate
from jobs.retention import FINAL_STATUSES, RetentionError, parse_days
from jobs.selectors import parse_uuid, read_job_filters
from jobs.selectors.timeouts import is_timeout

VERBS = {"cancel": ("Cancel", "Cancelled", "cancelled"), "retry": ("Retry", "Retried", "retried")}


def _back(request: HttpRequest, fallback: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = fallback
    return HttpResponseRedirect(target or fallback)


def _plural(n: int, word: str = "job") -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


# --- one job ---------------------------------------------------------------------


@action
def cancel(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    try:
        changed = operator_actions.cancel_job(
            job_id, user=request.user, reason=request.POST.get("reason", "")
        )
    except JobNotFound:
        raise Http404("No such job.") from None
    if changed:
        messages.success(request, "Job cancelled.")
    else:
        messages.info(request, "The job had already ended; nothing changed.")
    return _back(request, reverse("dashboard:job", args=[job_id]))


@action
def retry(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    if operator_actions.retry_job(job_id, user=request.user, reason=request.POST.get("reason", "")):
        messages.success(request, "Job queued again.")
    else:
        messages.info(request, "Only failed or cancelled jobs can be retried; nothing changed.")
    return _back(request, reverse("dashboard:job", args=[job_id]))


@action
def run_now(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    try:
        changed = operator_actions.run_now(
            job_id, user=request.user, reason=request.POST.get("reason", "")
        )
    except JobNotFound:
        raise Http404("No such job.") from None
    if changed:
        messages.success(request, "The job may run now: its queue's workers were told.")
    else:
        messages.info(
            request, "The job was not waiting for a later time any more; nothing changed."
        )
    return _back(request, reverse("dashboard:job", args=[job_id]))


@action
def discard(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """Delete a finished job; on success go to the list, since its page is gone."""
    try:
        outcome = operator_actions.discard_job(
            job_id, user=request.user, reason=request.POST.get("reason", "")
        )
    except JobNotFound:
        raise Http404("No such job.") from None
    if outcome.refused:
        messages.error(request, outcome.refused)
        return HttpResponseRedirect(reverse("dashboard:job", args=[job_id]))
    children = outcome.deleted - 1
    text = f"Job {str(job_id)[:8]} discarded"
    text += f" with {_plural(children, 'descendant')}." if children else "."
    messages.success(request, text)
    return HttpResponseRedirect(reverse("dashboard:jobs"))


# --- bulk ------------------------------------------------------------------------


@action
def bulk(request: HttpRequest) -> HttpResponse:
    """Two steps on one URL: without ``confirm`` show what would change, with it run.

    The filters travel in the query string (as on the list), the selection
    and the action in the form.
    """
    filters = read_job_filters(request.GET)
    if filters.errors:
        # A filter that is reported and not applied would widen the action to
        # jobs the operator never meant: refuse instead.
        query = request.GET.urlencode()
        return refused(
            request,
            filters.errors.values(),
            heading="The filter could not be read",
            back=reverse("dashboard:jobs") + (f"?{query}" if query else ""),
        )
    kind, _, scope = request.POST.get("do", "").partition("-")
    scope = "filter" if scope == "filter" else "selected"
    ids = [i for i in (parse_uuid(v) for v in request.POST.getlist("ids")[:1000]) if i]
    list_url = reverse("dashboard:jobs") + (f"?{filters.querystring()}" if filters.active else "")
    if kind not in bulk_actions.ACTIONS:
        messages.error(request, "Choose Cancel or Retry.")
        return HttpResponseRedirect(list_url)
    if scope == "selected" and not ids:
        messages.warning(
            request, "Select at least one job, or act on every job matching the filter."
        )
        return HttpResponseRedirect(list_url)
    try:
        plan = bulk_actions.plan_bulk(kind, scope=scope, ids=ids, filters=filters)
    except DatabaseError as error:
        if not is_timeout(error):
            raise
        return timeout_response(request)
    verb, done, _ = VERBS[kind]
    if request.POST.get("confirm") != "1":
        context = {
            **base_context(request, "jobs"),
            "plan": plan,
            "verb": verb,
            "filters": filters,
            "list_url": list_url,
            "post_url": request.get_full_path(),
        }
        return render(request, "dashboard/bulk_confirm.html", context)
    try:
        changed = bulk_actions.run_bulk(
            plan, user=request.user, reason=request.POST.get("reason", "")
        )
    except DatabaseError as error:
        if not is_timeout(error):
            raise
        return timeout_response(request)  # batches already written stay written
    if changed:
        text = f"{done} {_plural(changed)}."
        if plan.truncated:
            text += f" At most {plan.limit:,} change per run: run it again for the rest."
        messages.success(request, text)
    else:
        messages.info(request, f"No job could be {VERBS[kind][2]}; nothing changed.")
    return HttpResponseRedirect(list_url)


# --- workers and queues -------------------------------------------------------------


@action
def requeue(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    if operator_actions.requeue_orphan(job_id, user=request.user):
        messages.success(request, "Job requeued: another worker will pick it up.")
    else:
        messages.info(request, "The job is no longer orphaned (its worker is alive or it ended).")
    return _back(request, reverse("dashboard:workers"))


def _queue_name(request: HttpRequest) -> str:
    name = request.POST.get("name", "").strip()
    if not name or len(name) > 200:
        raise Http404("No such queue.")
    return name


@action
def pause(request: HttpRequest) -> HttpResponse:
    name = _queue_name(request)
    operator_actions.set_paused(name, True, user=request.user)
    messages.success(request, f"Queue {name} paused: workers stop claiming from it.")
    return _back(request, reverse("dashboard:queues"))


@action
def resume(request: HttpRequest) -> HttpResponse:
    name = _queue_name(request)
    operator_actions.set_paused(name, False, user=request.user)
    messages.success(request, f"Queue {name} resumed.")
    return _back(request, reverse("dashboard:queues"))


def _parse_cap(raw: str) -> int | None:
    """A cap from the form: blank clears it; otherwise ``check_cap``'s whole number (ValueError)."""
    raw = (raw or "").strip()
    return check_cap(int(raw)) if raw else None


@action
def set_cap(request: HttpRequest) -> HttpResponse:
    name = _queue_name(request)
    try:
        value = _parse_cap(request.POST.get("concurrency_cap", ""))
    except ValueError:
        messages.error(
            request, "The cap must be a whole number from 1 to 100,000, or empty for none."
        )
        return _back(request, reverse("dashboard:queues"))
    operator_actions.set_concurrency_cap(name, value, user=request.user)
    if value is None:
        messages.success(request, f"Queue {name} has no concurrency cap now.")
    else:
        messages.success(request, f"Queue {name} runs at most {_plural(value)} at once.")
    return _back(request, reverse("dashboard:queues"))


@action
def set_rate_limit(request: HttpRequest) -> HttpResponse:
    name = _queue_name(request)
    try:
        value = parse_rate(request.POST.get("rate_limit_per_second", ""))
    except LimitError as error:
        messages.error(request, f"{error} Leave it empty for none.")
        return _back(request, reverse("dashboard:queues"))
    operator_actions.set_rate_limit(name, value, user=request.user)
    if value is None:
        messages.success(request, f"Queue {name} has no rate limit now.")
    else:
        messages.success(request, f"Queue {name} starts at most {value:g} jobs a second.")
    return _back(request, reverse("dashboard:queues"))


@action
def set_retention(request: HttpRequest) -> HttpResponse:
    """A queue's retention by status, in days; a blank field follows the settings."""
    name = _queue_name(request)
    try:
        days = {
            status: value
            for status in FINAL_STATUSES
            if (value := parse_days(request.POST.get(f"retention_{status}", ""))) is not None
        }
        operator_actions.set_queue_retention(name, days or None, user=request.user)
    except RetentionError as error:
        messages.error(request, f"{error} Leave a field empty to follow the settings.")
        return _back(request, reverse("dashboard:queues"))
    if days:
        kept = ", ".join(f"{status} {value:g} d" for status, value in days.items())
        messages.success(request, f"Queue {name} keeps finished jobs: {kept}.")
    else:
        messages.success(request, f"Queue {name} follows the settings' retention now.")
    return _back(request, reverse("dashboard:queues"))
