"""The queues page's key limits: set or clear a key family's or one key's limits.

Each view checks the role (``action``, as the queue cap and rate forms do),
reads the form, calls the audited service (``jobs.operator_actions``) and
redirects back to the queues page with a message saying what changed, or
what rule the input broke (nothing is stored then).
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from dashboard.key_limit_form import describe, read_limits
from dashboard.views.common import action
from jobs import operator_actions
from jobs.key_limits import KeyLimitError


def _name(request: HttpRequest) -> str:
    return request.POST.get("name", "").strip()


def _back() -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("dashboard:queues") + "#key-limits")


@action
def set_key_limits(request: HttpRequest) -> HttpResponse:
    name = _name(request)
    try:
        values = read_limits(request.POST)
        operator_actions.set_key_limits(name, values, user=request.user)
    except KeyLimitError as error:
        rules = [rule for field_rules in error.errors.values() for rule in field_rules]
        messages.error(request, f"Nothing was changed for {name or 'that key'}: {' '.join(rules)}")
        return _back()
    messages.success(request, f"Key limits of {name}: {describe(values)}.")
    return _back()


@action
def delete_key_limits(request: HttpRequest) -> HttpResponse:
    name = _name(request)
    if operator_actions.delete_key_limits(name, user=request.user):
        messages.success(
            request,
            f"The limits of {name} are removed: its keys follow their family's limits, if any.",
        )
    else:
        messages.info(request, f"{name or 'That key'} had no limits of its own; nothing changed.")
    return _back()
