"""POST /jobs/cancel and POST /jobs/retry: filter bodies, bounded batches, refusals."""

from __future__ import annotations

import uuid

import pytest

from jobs import bulk_actions as actions
from jobs.models import Job
from tests.factories import (
    cancelled,
    failed,
    fresh,
    queued,
    running,
    succeeded,
)

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db


def statuses(jobs) -> list[str]:
    return [fresh(j).status for j in jobs]


def test_bulk_cancel_by_queue_in_small_batches(operator, monkeypatch):
    monkeypatch.setattr(actions, "BULK_BATCH_SIZE", 3)
    calls = []
    original = actions.cancel_jobs

    def counting(ids, **kwargs):
        calls.append(len(ids))
        return original(ids, **kwargs)

    monkeypatch.setattr(actions, "cancel_jobs", counting)
    targets = [queued(queue="bulk") for _ in range(8)]
    other = queued(queue="other")
    done = succeeded(queue="bulk-done")
    response = operator.post("/jobs/cancel", {"queue": "bulk", "reason": "drain"})
    assert response.status_code == 200, response.content
    assert response.json() == {"changed": 8}
    assert calls == [3, 3, 2]
    assert set(statuses(targets)) == {"cancelled"}
    assert statuses([other, done]) == ["queued", "succeeded"]
    event = fresh(targets[0]).events.order_by("-seq").first()
    assert event.fields == {"by": "operator", "reason": "drain"}


def test_bulk_cancel_by_ids_counts_cascades_and_skips_terminal(operator):
    parent, _ = running(queue="p")
    child = queued(parent=parent.pk)
    done = succeeded()
    response = operator.post("/jobs/cancel/", {"ids": [str(parent.pk), str(done.pk)]})
    assert response.json() == {"changed": 2}
    assert statuses([parent, child, done]) == ["cancelled", "cancelled", "succeeded"]


def test_bulk_cancel_filters_combine(operator):
    a = queued(queue="mix", operation="ping")
    b = queued(queue="mix", operation="sleep", payload={"seconds": 1})
    response = operator.post("/jobs/cancel", {"queue": ["mix"], "operation": "sleep"})
    assert response.json() == {"changed": 1}
    assert statuses([a, b]) == ["queued", "cancelled"]


def test_bulk_retry_of_failed_and_cancelled(operator, monkeypatch):
    monkeypatch.setattr(actions, "BULK_BATCH_SIZE", 2)
    f1, f2, c1 = failed(), failed(), cancelled()
    keep = succeeded()
    response = operator.post("/jobs/retry", {"status": ["failed", "cancelled", "succeeded"]})
    assert response.json() == {"changed": 3}
    assert statuses([f1, f2, c1, keep]) == ["queued", "queued", "queued", "succeeded"]
    assert operator.post("/jobs/retry", {"status": "failed"}).json() == {"changed": 0}


def test_empty_filter_is_refused_unless_all(operator):
    jobs = [queued() for _ in range(3)]
    error = assert_error_shape(operator.post("/jobs/cancel", {}), 400)
    assert "all" in error["errors"]
    assert_error_shape(operator.post("/jobs/cancel", {"reason": "x"}), 400)
    assert_error_shape(operator.post("/jobs/retry"), 400)
    assert_error_shape(operator.post("/jobs/cancel", {"all": False}), 400)
    assert set(statuses(jobs)) == {"queued"}
    assert operator.post("/jobs/cancel", {"all": True}).json() == {"changed": 3}
    assert set(statuses(jobs)) == {"cancelled"}
    assert operator.post("/jobs/retry", {"all": True}).json() == {"changed": 3}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "sideways"}, "status"),
        ({"ids": ["nope"]}, "ids"),
        ({"ids": []}, "ids"),
        ({"ids": "abc"}, "ids"),
        ({"parent": "x"}, "parent"),
        ({"created_after": "later"}, "created_after"),
        ({"queue": {"a": 1}}, "queue"),
        ({"all": "yes please"}, "all"),
        ({"everything": True}, "everything"),
    ],
)
def test_bulk_refuses_bad_filters(operator, body, field):
    queued()
    error = assert_error_shape(operator.post("/jobs/cancel", body), 400)
    assert any(k == field or k.startswith(f"{field}.") for k in error["errors"]), error
    assert not Job.objects.filter(status="cancelled").exists()


def test_bulk_with_unknown_ids_changes_nothing(operator):
    assert operator.post("/jobs/cancel", {"ids": [str(uuid.uuid4())]}).json() == {"changed": 0}
