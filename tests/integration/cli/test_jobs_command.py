"""``manage.py jobs``: list, show, cancel, retry and purge, on PostgreSQL and SQLite.

Jobs are put in their states through the public functions (enqueue, claim,
fail, complete); the only direct write is moving ``finished_at`` back in
time, as the reaper's retention tests do, so a purge has old jobs to find.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_controlplane.api.serializers import JobSerializer
from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job, JobEvent, OperatorAction
from tests.conftest import ROOT
from tests.factories import (
    cancelled,
    failed,
    fresh,
    queued,
    running,
    succeeded,
    timeline,
    unique_queue,
)

pytestmark = pytest.mark.django_db


def age(job: Job, days: float) -> Job:
    """Pretend ``job`` finished ``days`` ago (the retention tests' way)."""
    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(days=days))
    return job


def ids_of(run) -> list[str]:
    """The job ids of a table printed by ``jobs list`` (first column, header skipped)."""
    return [line.split()[0] for line in run.lines()[1:]]


# --- list ---------------------------------------------------------------------------


def test_list_applies_the_api_filters_newest_first(jobs) -> None:
    q = unique_queue()
    second = failed(queue=q)  # first: claiming it takes the oldest queued job of q
    first = queued(queue=q)
    third = queued("sleep", {"seconds": 1}, queue=q)
    child = queued(queue=q, parent=first.pk)
    elsewhere = queued()

    everything = jobs("list", "--queue", q)
    assert everything.code == 0, everything.err
    assert everything.lines()[0].split() == [
        "ID",
        "OPERATION",
        "QUEUE",
        "STATUS",
        "ATTEMPTS",
        "CREATED",
        "(UTC)",
    ]
    assert ids_of(everything) == [str(j.pk) for j in (child, third, first, second)]
    row = next(line for line in everything.lines() if line.startswith(str(second.pk)))
    assert row.split()[1:5] == ["ping", q, "failed", "1/1"]

    assert ids_of(jobs("list", "--queue", q, "--status", "failed")) == [str(second.pk)]
    assert ids_of(
        jobs("list", "--queue", q, "--status", "failed,queued", "--operation", "sleep")
    ) == [str(third.pk)]
    assert ids_of(jobs("list", "--parent", str(first.pk))) == [str(child.pk)]
    assert str(child.pk) not in ids_of(jobs("list", "--queue", q, "--parent", "none"))
    assert ids_of(jobs("list", "--q", str(elsewhere.pk)[:23])) == [str(elsewhere.pk)]
    assert ids_of(jobs("list", "--queue", q, "--q", "boom")) == [str(second.pk)]
    assert jobs("list", "--queue", "no-such-queue").out.strip() == "No job matches."


def test_list_json_is_the_api_job_json_one_per_line(jobs) -> None:
    q = unique_queue()
    made = [failed(queue=q), queued(queue=q)]
    run = jobs("list", "--queue", q, "--json")
    assert run.code == 0, run.err
    rows = [json.loads(line) for line in run.lines()]
    assert [r["id"] for r in rows] == [str(made[1].pk), str(made[0].pk)]
    assert rows[1] == json.loads(json.dumps(JobSerializer(fresh(made[0])).data))
    assert rows[1]["status"] == "failed" and rows[1]["error_code"] == "Boom"


def test_list_limit_pages_past_the_api_page_size_and_says_when_more_match(jobs) -> None:
    q = unique_queue()
    made = enqueue_many([JobSpec("ping", queue=q) for _ in range(520)])
    newest_first = sorted(made, key=lambda j: (j.created_at, j.pk), reverse=True)

    default = jobs("list", "--queue", q)
    assert len(ids_of(default)) == 50 and "More jobs match" in default.err

    run = jobs("list", "--queue", q, "--limit", "510", "--json")
    assert [json.loads(line)["id"] for line in run.lines()] == [
        str(j.pk) for j in newest_first[:510]
    ]
    assert "More jobs match than the 510 shown" in run.err

    everything = jobs("list", "--queue", q, "--limit", "1000", "--json")
    assert len(everything.lines()) == 520 and everything.err == ""


# --- show ---------------------------------------------------------------------------


def test_show_prints_fields_and_the_timeline(jobs) -> None:
    job = failed()
    run = jobs("show", str(job.pk))
    assert run.code == 0, run.err
    fields = dict(line.split(None, 1) for line in run.lines() if line and "  " in line[:20])
    assert fields["id"] == str(job.pk)
    assert fields["status"] == "failed" and fields["error_message"] == "boom"
    assert fields["payload"] == "{}"
    after = run.out.split("Timeline (3 events)\n", 1)[1].splitlines()
    assert after[0].split() == ["SEQ", "TS", "(UTC)", "LEVEL", "EVENT", "MESSAGE"]
    rows = [line.split() for line in after[1:]]
    assert [(r[0], r[3], r[4]) for r in rows] == [
        ("1", "info", "job.enqueued"),
        ("2", "info", "job.started"),
        ("3", "error", "job.failed"),
    ]


def test_show_json_has_the_job_and_its_events(jobs) -> None:
    parent = succeeded()
    queued(parent=parent.pk)
    run = jobs("show", str(parent.pk), "--json")
    data = json.loads(run.out)
    assert data["id"] == str(parent.pk) and data["result"] == {"pong": True}
    assert data["children"]["queued"] == 1
    assert [e["seq"] for e in data["events"]] == [seq for seq, _ in timeline(parent)]
    assert data["events"][-1]["event"] == "job.succeeded"


def test_show_keeps_control_characters_out_of_the_terminal(jobs) -> None:
    job = failed()
    JobEvent.objects.filter(job=job, event="job.failed").update(message="red\x1b[31m\nline")
    run = jobs("show", str(job.pk))
    assert "\x1b" not in run.out and "red\\x1b[31m\\nline" in run.out


# --- cancel and retry ---------------------------------------------------------------


def test_cancel_by_id_writes_the_actor_into_the_event_and_the_audit_log(jobs) -> None:
    job = queued()
    run = jobs("cancel", str(job.pk), "--by", "alice", "--reason", "wrong account")
    assert run.code == 0, run.err
    assert run.out.strip() == f"Cancelled job {job.pk}."
    assert fresh(job).status == "cancelled"
    event = JobEvent.objects.get(job=job, event="job.cancelled")
    assert event.fields == {"by": "alice", "reason": "wrong account"}
    action = OperatorAction.objects.get()
    assert (action.username, action.user, action.action, action.target, action.count) == (
        "alice",
        None,
        "cancel",
        str(job.pk),
        1,
    )


def test_the_actor_defaults_to_the_login_name(jobs, monkeypatch) -> None:
    monkeypatch.setenv("LOGNAME", "shell-user")
    job = failed()
    assert jobs("retry", str(job.pk)).code == 0
    event = JobEvent.objects.get(job=job, event="job.retried")
    assert event.fields["by"] == "shell-user"
    assert OperatorAction.objects.get().username == "shell-user"


def test_cancel_of_a_finished_job_changes_nothing_and_exits_1(jobs) -> None:
    done = succeeded()
    before = timeline(done)
    run = jobs("cancel", str(done.pk), "--by", "alice")
    assert run.code == 1
    assert f"Job {done.pk} is succeeded" in run.err and "Nothing was changed" in run.err
    assert fresh(done).status == "succeeded" and timeline(done) == before


def test_an_unknown_id_stops_the_whole_command(jobs) -> None:
    job = queued()
    ghost = uuid.uuid4()
    run = jobs("cancel", str(job.pk), str(ghost))
    assert run.code == 1 and f"No job with id {ghost} exists." in run.err
    assert fresh(job).status == "queued"
    assert not OperatorAction.objects.exists()
    assert jobs("show", str(ghost)).code == 1


def test_retry_puts_failed_and_cancelled_jobs_back_and_refuses_others(jobs) -> None:
    broken, stopped = failed(), cancelled()
    busy, _ = running()
    run = jobs("retry", str(broken.pk), str(stopped.pk), str(busy.pk), "--by", "bob")
    assert run.code == 0  # two of three changed
    assert run.lines() == [f"Retried job {broken.pk}.", f"Retried job {stopped.pk}."]
    assert f"Job {busy.pk} is running: only failed or cancelled jobs" in run.err
    assert fresh(broken).status == fresh(stopped).status == "queued"
    assert fresh(busy).status == "running"
    assert JobEvent.objects.get(job=broken, event="job.retried").fields["by"] == "bob"
    assert jobs("retry", str(busy.pk)).code == 1


def test_bulk_cancel_counts_without_yes_and_acts_with_it(jobs) -> None:
    q = unique_queue()
    done = succeeded(queue=q)
    targets = [queued(queue=q) for _ in range(3)]
    kid = queued(parent=targets[0].pk)
    other = queued()

    dry = jobs("cancel", "--queue", q, "--by", "carol")
    assert dry.code == 1
    assert dry.out.strip() == (
        "3 jobs would be cancelled (and their queued or running descendants)."
    )
    assert "run again with --yes" in dry.err
    assert {fresh(j).status for j in targets} == {"queued"}
    assert not OperatorAction.objects.exists()

    run = jobs("cancel", "--queue", q, "--by", "carol", "--reason", "dupes", "--yes")
    assert run.code == 0, run.err
    assert run.out.strip() == "Cancelled 4 jobs."  # the child cascades
    assert {fresh(j).status for j in [*targets, kid]} == {"cancelled"}
    assert fresh(done).status == "succeeded" and fresh(other).status == "queued"
    fields = JobEvent.objects.filter(event="job.cancelled").values_list("fields", flat=True)
    assert len(fields) == 4
    assert all(f["by"] == "carol" and f["reason"] == "dupes" for f in fields)
    action = OperatorAction.objects.get()
    assert (action.action, action.count, action.username) == ("bulk_cancel", 4, "carol")
    assert action.filter == {"scope": "filter", "queue": [q]}

    again = jobs("cancel", "--queue", q, "--yes")
    assert again.code == 1 and "No queued or running job matches" in again.err


def test_bulk_retry_by_status(jobs) -> None:
    q = unique_queue()
    broken = [failed(queue=q) for _ in range(2)]
    fine = succeeded(queue=q)
    run = jobs("retry", "--queue", q, "--status", "failed", "--yes", "--by", "dave")
    assert run.code == 0 and run.out.strip() == "Retried 2 jobs."
    assert {fresh(j).status for j in broken} == {"queued"} and fresh(fine).status == "succeeded"
    assert OperatorAction.objects.get().filter == {
        "scope": "filter",
        "status": ["failed"],
        "queue": [q],
    }


def test_an_action_needs_ids_or_a_filter_not_both(jobs) -> None:
    job = queued()
    nothing = jobs("cancel", "--yes")
    assert nothing.code == 2 and "--all for every job" in nothing.err
    both = jobs("cancel", str(job.pk), "--queue", job.queue)
    assert both.code == 2 and "not both" in both.err
    assert fresh(job).status == "queued"
    everything = jobs("cancel", "--all", "--yes", "--by", "erin")
    assert everything.code == 0 and fresh(job).status == "cancelled"
    assert OperatorAction.objects.get().filter == {"scope": "filter"}


# --- purge --------------------------------------------------------------------------


def test_purge_dry_run_counts_and_the_real_one_deletes_only_old_finished_jobs(jobs) -> None:
    q = unique_queue()
    old = [age(succeeded(queue=q), 10), age(failed(queue=q), 10), age(cancelled(queue=q), 10)]
    recent = succeeded(queue=q)
    busy, _ = running(queue=q)
    parent = age(succeeded(queue=q), 10)
    kid = queued(queue=q, parent=parent.pk)  # a parent whose child stays, stays
    waiting = queued(queue=q)
    # The status guard, not finished_at, keeps these: give them an old finished_at too.
    Job.objects.filter(pk__in=[busy.pk, waiting.pk]).update(
        finished_at=timezone.now() - timedelta(days=30)
    )

    dry = jobs("purge", "--older-than", "7d", "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("3 jobs finished before ") and "dry run" in dry.out
    assert Job.objects.count() == 8 and not OperatorAction.objects.exists()

    run = jobs("purge", "--older-than", "7d", "--by", "frank", "--batch-size", "2")
    assert run.code == 0, run.err
    assert run.out.startswith("Deleted 3 jobs finished before ")
    assert not Job.objects.filter(pk__in=[j.pk for j in old]).exists()
    assert not JobEvent.objects.filter(job_id__in=[j.pk for j in old]).exists()
    kept = {j.pk: fresh(j).status for j in (recent, busy, waiting, parent, kid)}
    assert kept == {
        recent.pk: "succeeded",
        busy.pk: "running",
        waiting.pk: "queued",
        parent.pk: "succeeded",
        kid.pk: "queued",
    }
    assert len(timeline(busy)) == 2  # its events stay with it
    action = OperatorAction.objects.get()
    assert (action.action, action.count, action.username) == ("purge", 3, "frank")
    assert action.filter == {"older_than_seconds": 7 * 86400}

    again = jobs("purge", "--older-than", "7d")
    assert again.code == 1 and "Nothing was deleted" in again.err


def test_purge_takes_parents_after_their_children_and_honours_its_filters(jobs) -> None:
    q = unique_queue()
    parent = age(failed(queue=q), 2)
    child = failed(queue=q, parent=parent.pk)
    grandchild = age(succeeded(queue=q, parent=child.pk), 2)
    age(child, 2)
    other_queue = age(succeeded(), 2)
    other_status = age(cancelled(queue=q), 2)

    dry = jobs(
        "purge", "--older-than", "12h", "--queue", q, "--status", "failed,succeeded", "--dry-run"
    )
    assert dry.out.startswith("3 jobs ")
    run = jobs(
        "purge",
        "--older-than",
        "12h",
        "--queue",
        q,
        "--status",
        "failed,succeeded",
        "--batch-size",
        "1",
    )
    assert run.code == 0 and run.out.startswith("Deleted 3 jobs ")
    assert not Job.objects.filter(pk__in=[parent.pk, child.pk, grandchild.pk]).exists()
    assert fresh(other_queue).status == "succeeded" and fresh(other_status).status == "cancelled"


def test_purge_refuses_active_statuses_and_bad_ages(jobs) -> None:
    assert jobs("purge", "--older-than", "1d", "--status", "running").code == 2
    assert (
        "only deletes finished jobs"
        in jobs("purge", "--older-than", "1d", "--status", "queued").err
    )
    bad_age = jobs("purge", "--older-than", "a week")
    assert bad_age.code != 0 and "is not an age" in bad_age.err
    before_year_1 = jobs("purge", "--older-than", "9999999d")
    assert before_year_1.code == 2 and "before year 1" in before_year_1.err
    too_long = jobs("purge", "--older-than", "99999999999d")
    assert too_long.code != 0 and "longer than any date" in too_long.err


# --- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("list", "--status", "bogus"), "Unknown status 'bogus'"),
        (("list", "--parent", "nope"), "--parent: 'parent' must be a job id"),
        (("list", "--created-after", "yesterday"), "--created-after:"),
        (("show", "not-a-uuid"), "'not-a-uuid' is not a job id"),
        (("cancel", "12345"), "'12345' is not a job id"),
        (("retry", "--status", "done", "--yes"), "Unknown status 'done'"),
        (("cancel", "--all", "--by", "  "), "--by must be a name"),
        (("cancel", "--all", "--reason", "a\x00b"), "--reason:"),
    ],
)
def test_bad_input_is_a_usage_error_with_a_sentence(jobs, args, message) -> None:
    job = queued()
    run = jobs(*args)
    assert run.code == 2 and message in run.err, run
    assert fresh(job).status == "queued"


def test_argparse_refusals_are_command_errors(jobs) -> None:
    for args in (("list", "--limit", "0"), ("list", "--limit", "1001"), ("frobnicate",)):
        run = jobs(*args)
        assert run.code != 0 and run.err.startswith("Error:"), run


# --- a real process -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_real_process(subprocess_env) -> None:
    q = unique_queue()
    made = [failed(queue=q), queued(queue=q)]

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "jobs", *args],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = manage("list", "--json", "--queue", q)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["id"], r["status"]) for r in rows] == [
        (str(made[1].pk), "queued"),
        (str(made[0].pk), "failed"),
    ]

    ghost = manage("cancel", str(uuid.uuid4()))
    assert ghost.returncode == 1 and "No job with id" in ghost.stderr
    assert "Traceback" not in ghost.stderr

    for args in (("list", "--status", "bogus"), ("list", "--limit", "0")):
        refused = manage(*args)
        assert refused.returncode == 2, refused.stderr
        assert "Traceback" not in refused.stderr
