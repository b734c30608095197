"""``/jobs/<id>/logs``: the log page with the timeline's cursor, and a remote worker's
batches with the bounds counted on the server."""

from __future__ import annotations

import pytest

from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED
from jobs.models import JobEvent
from jobs.transitions import RunEvent, append_run_events, cancel_job, emit_event
from tests.factories import assert_consistent, running

from .conftest import assert_error_shape, claim_one, register_worker

pytestmark = pytest.mark.django_db


def log_event(message: str, age: float = 0.0) -> RunEvent:
    fields = {"logger": "ops", "levelname": "INFO", "source": "logging"}
    return RunEvent(JOB_LOG, "info", message, fields, age)


def test_logs_page_with_the_timeline_cursor(viewer):
    job, held = running()
    append_run_events(
        job.pk, [log_event("a", 2.0), log_event("b", 1.0)], lease_token=held.lease_token
    )
    emit_event(job.pk, event="test.step", lease_token=held.lease_token)
    append_run_events(job.pk, [log_event("c")], lease_token=held.lease_token)
    assert [e for _, e in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        JOB_LOG,
        JOB_LOG,
        "test.step",
        JOB_LOG,
    ]
    page = viewer.get(f"/jobs/{job.pk}/logs", limit=2).json()
    assert [e["message"] for e in page["results"]] == ["a", "b"]
    assert page["has_more"] is True and page["last_seq"] == 4
    first, second = page["results"]
    assert first["ts"] < second["ts"]  # each record's own time (its age), in order
    assert first["fields"] == {"logger": "ops", "levelname": "INFO", "source": "logging"}
    page = viewer.get(f"/jobs/{job.pk}/logs", after=page["last_seq"], limit=2).json()
    assert [(e["seq"], e["message"]) for e in page["results"]] == [(6, "c")]
    assert page["has_more"] is False and page["last_seq"] == 6
    # Nothing new: the cursor stays at the end; a later record is the next page.
    assert viewer.get(f"/jobs/{job.pk}/logs", after=6).json() == {
        "results": [],
        "last_seq": 6,
        "has_more": False,
    }
    append_run_events(job.pk, [log_event("d")], lease_token=held.lease_token)
    assert [
        e["message"] for e in viewer.get(f"/jobs/{job.pk}/logs/", after=6).json()["results"]
    ] == ["d"]
    # The events endpoint shows them in the timeline, same seqs.
    events = viewer.get(f"/jobs/{job.pk}/events", after=2).json()["results"]
    assert [(e["seq"], e["event"]) for e in events][:2] == [(3, JOB_LOG), (4, JOB_LOG)]


def test_logs_page_errors(viewer, api_for):
    job, _ = running()
    assert_error_shape(viewer.get(f"/jobs/{job.pk}/logs", after="x"), 400)
    assert_error_shape(viewer.get(f"/jobs/{job.pk}/logs", cursor="1"), 400)
    assert_error_shape(viewer.get("/jobs/00000000-0000-0000-0000-000000000000/logs"), 404)
    assert api_for("anonymous").get(f"/jobs/{job.pk}/logs").status_code in (401, 403)


def test_a_run_never_writes_into_a_later_run(viewer):
    job, held = running()
    cancel_job(job.pk)  # lease cleared: the run's own tail is still written
    assert append_run_events(job.pk, [log_event("tail")], lease_token=held.lease_token) == 1
    other = running()[1]
    assert append_run_events(other.id, [log_event("x")], lease_token=held.lease_token) == 0
    assert_consistent(other.id)


def test_remote_logs_are_bounded_on_the_server(api_for, settings):
    settings.CONTROLPLANE = {
        **getattr(settings, "CONTROLPLANE", {}),
        "JOB_LOG_MAX_RECORDS": 5,
        "JOB_LOG_MAX_MESSAGE_CHARS": 50,
    }
    remote = api_for("remote")
    job_id, token = claim_one(remote, register_worker(remote))

    def post(records, **extra):
        return remote.post(
            f"/jobs/{job_id}/logs", {"lease_token": token, "records": records, **extra}
        )

    reply = post(
        [
            {"message": "one", "level": "INFO", "logger": "ops", "age": 1.5},
            {"message": "<script>alert(1)</script>", "level": "warning"},
            {"message": "x" * 80, "level": "critical"},
        ]
    )
    assert reply.status_code == 201, reply.content
    assert reply.json() == {"job": job_id, "stored": 3, "dropped": 0, "truncated": False}
    reply = post([{"message": f"more {n}"} for n in range(4)])
    assert reply.json() == {"job": job_id, "stored": 2, "dropped": 2, "truncated": True}
    reply = post([{"message": "after the cut"}])
    assert reply.json() == {"job": job_id, "stored": 0, "dropped": 1, "truncated": True}
    logs = list(
        JobEvent.objects.filter(job_id=job_id, event__in=[JOB_LOG, JOB_LOG_TRUNCATED]).order_by(
            "seq"
        )
    )
    assert [e.event for e in logs] == [JOB_LOG] * 5 + [JOB_LOG_TRUNCATED]
    assert [e.level for e in logs[:3]] == ["info", "warning", "error"]
    assert logs[0].fields == {"logger": "ops", "levelname": "INFO", "source": "remote"}
    assert logs[1].message == "<script>alert(1)</script>"  # stored as text; pages escape it
    assert logs[2].message.startswith("x" * 38 + "… [truncated: 30 of 80")
    assert logs[0].ts < logs[1].ts  # stamped with the server's time less the age
    assert logs[-1].fields["dropped_records"] == 2
    assert_consistent(job_id)


def test_remote_logs_refuse_bad_input_and_stale_tokens(api_for, viewer):
    remote = api_for("remote")
    job_id, token = claim_one(remote, register_worker(remote))
    url = f"/jobs/{job_id}/logs"
    body = assert_error_shape(
        remote.post(url, {"lease_token": token, "records": [{"message": "a", "level": "loud"}]}),
        400,
    )
    assert "records.0.level" in body["errors"]
    assert_error_shape(remote.post(url, {"lease_token": token, "records": []}), 400)
    assert_error_shape(
        remote.post(url, {"lease_token": token, "records": [{"level": "info"}]}), 400
    )
    assert_error_shape(remote.post(url, {"lease_token": token, "records": "no"}), 400)
    stale = "00000000-0000-0000-0000-000000000001"
    assert_error_shape(remote.post(url, {"lease_token": stale, "records": [{"message": "a"}]}), 409)
    assert (
        viewer.post(url, {"lease_token": token, "records": [{"message": "a"}]}).status_code == 403
    )
    cancel_job(job_id)
    assert_error_shape(remote.post(url, {"lease_token": token, "records": [{"message": "a"}]}), 409)
    assert not JobEvent.objects.filter(job_id=job_id, event=JOB_LOG).exists()


@pytest.mark.parametrize(
    "raw",
    [
        '{"lease_token": "TOKEN", "records": [{"message": "a\\u0000b"}]}',  # NUL
        '{"lease_token": "TOKEN", "records": [{"message": "\\ud800"}]}',  # a lone surrogate
        '{"lease_token": "TOKEN", "records": [{"message": "a", "age": 1e400}]}',  # inf
        '{"lease_token": "TOKEN", "records": [{"message": "a", "logger": '
        + "[" * 5000
        + "]" * 5000
        + "}]}",
        '{"lease_token": "TOKEN", "records": [',  # cut short
        "[" * 100_000 + "]" * 100_000,  # nested past any parser's patience
    ],
)
def test_hostile_log_bodies_get_a_clear_4xx_and_the_job_goes_on(api_for, raw):
    remote = api_for("remote")
    job_id, token = claim_one(remote, register_worker(remote))
    reply = remote.post(f"/jobs/{job_id}/logs", raw=raw.replace("TOKEN", token))
    assert 400 <= reply.status_code < 500, (reply.status_code, reply.content[:300])
    assert reply["Content-Type"].startswith("application/json")
    # Nothing was half-written, and the job still takes a good record.
    good = remote.post(
        f"/jobs/{job_id}/logs", {"lease_token": token, "records": [{"message": "ok"}]}
    )
    assert good.status_code == 201, good.content
    assert list(
        JobEvent.objects.filter(job_id=job_id, event=JOB_LOG).values_list("message", flat=True)
    ) == ["ok"]
