"""Every dashboard action on jobs and queues writes its audit row, as the API's routes do."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from jobs.models import OperatorAction
from tests.factories import failed, queued

pytestmark = pytest.mark.django_db


def _job(kind: str) -> str:
    return str((queued if kind == "queued" else failed)(queue="audited").pk)


# name -> (url name, needs a job of this kind or None, form, audit action)
ACTIONS: dict[str, tuple[str, str | None, dict[str, Any], str]] = {
    "pause": ("dashboard:pause", None, {"name": "audited"}, "pause"),
    "resume": ("dashboard:resume", None, {"name": "audited"}, "resume"),
    "cap": ("dashboard:cap", None, {"name": "audited", "concurrency_cap": "3"}, "set_cap"),
    "rate": (
        "dashboard:rate-limit",
        None,
        {"name": "audited", "rate_limit_per_second": "2"},
        "set_rate_limit",
    ),
    "cancel": ("dashboard:cancel", "queued", {"reason": "r"}, "cancel"),
    "retry": ("dashboard:retry", "failed", {"reason": "r"}, "retry"),
}


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_every_dashboard_action_writes_its_audit_row(name: str, operator_client: Client) -> None:
    url_name, job_kind, form, action = ACTIONS[name]
    if job_kind is None:
        url, target = reverse(url_name), "audited"
    else:
        target = _job(job_kind)
        url = reverse(url_name, kwargs={"job_id": target})
    before = set(OperatorAction.objects.values_list("pk", flat=True))
    response = operator_client.post(url, form)
    assert response.status_code in (200, 302), response.content[:300]
    rows = list(OperatorAction.objects.exclude(pk__in=before))
    assert [(r.action, r.target) for r in rows] == [(action, target)]
    assert rows[0].user is not None
