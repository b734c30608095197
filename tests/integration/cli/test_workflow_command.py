"""``manage.py workflow start|show|cancel`` and ``manage.py enqueue --depends-on/--on-failure``:
what they print, what they store and audit, and their exit codes (0 ok, 1 not found, 2 bad input).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_controlplane.testing import drain_jobs
from jobs import audit
from jobs.dependencies import dependency_rows
from jobs.models import Job, OperatorAction, Workflow
from tests.conftest import ROOT
from tests.factories import unique_queue

from .conftest import Run


def run(command: str, *args: str, stdin: str | None = None) -> Run:
    """``call_command``, a ``CommandError`` turned into its exit code (as in conftest)."""
    out, err = StringIO(), StringIO()
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = StringIO(stdin)
    try:
        call_command(command, *args, stdout=out, stderr=err)
    except CommandError as error:
        return Run(error.returncode, out.getvalue(), err.getvalue() + str(error))
    finally:
        sys.stdin = saved
    return Run(0, out.getvalue(), err.getvalue())


def spec(queue: str) -> dict[str, Any]:
    return {
        "name": "from the shell",
        "steps": [
            {"name": "fetch", "operation": "ping", "queue": queue},
            {"name": "merge", "operation": "ping", "queue": queue, "depends_on": ["fetch"]},
        ],
    }


def written(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "flow.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.mark.django_db
def test_start_from_a_file_prints_the_id_and_audits_it(tmp_path):
    done = run("workflow", "start", written(tmp_path, spec(unique_queue())), "--by", "ana")
    assert done.code == 0, done.err
    started = Workflow.objects.get(pk=uuid.UUID(done.out.strip()))
    assert (started.name, started.status, started.schedule_id) == (
        "from the shell",
        "running",
        None,
    )
    assert sorted(Job.objects.filter(workflow=started).values_list("step", flat=True)) == [
        "fetch",
        "merge",
    ]
    action = OperatorAction.objects.get(action=audit.START_WORKFLOW)
    assert (action.username, action.target, action.count) == ("ana", str(started.pk), 2)


@pytest.mark.django_db
def test_start_from_stdin():
    done = run("workflow", "start", "-", stdin=json.dumps(spec(unique_queue())))
    assert done.code == 0, done.err
    assert Workflow.objects.filter(pk=done.out.strip()).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "is not valid JSON"),
        ({"steps": [{"operation": "no.such.op"}]}, "steps.0.operation"),
        (
            {"steps": [{"operation": "ping"}, {"operation": "ping", "depends_on": ["zz"]}]},
            "steps.1.depends_on",
        ),
        ({"steps": []}, "steps"),
        ([1], "must be a JSON object"),
    ],
)
def test_bad_input_exits_2_with_the_field_and_stores_nothing(tmp_path, content, words):
    done = run("workflow", "start", written(tmp_path, content))
    assert done.code == 2 and words in done.err, done
    assert done.out == ""
    assert not Workflow.objects.exists() and not Job.objects.exists()
    assert not OperatorAction.objects.exists()


@pytest.mark.django_db
def test_a_missing_file_is_bad_input(tmp_path):
    done = run("workflow", "start", str(tmp_path / "nope.json"))
    assert done.code == 2 and "Cannot read" in done.err


@pytest.mark.django_db
def test_show_prints_status_steps_and_json(tmp_path):
    queue = unique_queue()
    started = run("workflow", "start", written(tmp_path, spec(queue))).out.strip()
    shown = run("workflow", "show", started)
    assert shown.code == 0, shown.err
    assert f"id          {started}" in shown.out and "status      running" in shown.out
    assert "queued 2" in shown.out
    assert [line.split()[:3] for line in shown.lines()[-2:]] == [
        ["fetch", "ping", "queued"],
        ["merge", "ping", "queued"],
    ]
    drain_jobs(queues=[queue])
    data = json.loads(run("workflow", "show", started, "--json").out)
    assert (data["status"], data["result"]) == ("succeeded", {"pong": True})
    assert data["step_counts"]["succeeded"] == 2 and len(data["steps"]) == 2
    one = run("workflow", "show", started, "--steps", "1")
    assert "1 more" in one.out


@pytest.mark.django_db
def test_show_and_cancel_exit_1_for_an_unknown_workflow_and_2_for_a_bad_id():
    for command in ("show", "cancel"):
        ghost = run("workflow", command, str(uuid.uuid4()))
        assert ghost.code == 1 and "No workflow with id" in ghost.err
        bad = run("workflow", command, "not-an-id")
        assert bad.code == 2 and "is not a workflow id" in bad.err


@pytest.mark.django_db
def test_cancel_cancels_the_steps_as_the_cli_user_and_audits(tmp_path):
    started = run("workflow", "start", written(tmp_path, spec(unique_queue()))).out.strip()
    done = run("workflow", "cancel", started, "--reason", "wrong day", "--by", "ops-bot")
    assert done.code == 0, done.err
    assert "2 jobs cancelled" in done.out
    assert Workflow.objects.get(pk=started).status == "cancelled"
    steps = Job.objects.filter(workflow_id=started)
    assert {j.status for j in steps} == {"cancelled"}
    action = OperatorAction.objects.get(action=audit.CANCEL_WORKFLOW)
    assert (action.username, action.target, action.count, action.reason) == (
        "ops-bot",
        started,
        2,
        "wrong day",
    )
    again = run("workflow", "cancel", started)
    assert again.code == 1 and "already ended (cancelled)" in again.err


@pytest.mark.django_db
def test_enqueue_depends_on_and_on_failure():
    queue = unique_queue()
    first = run("enqueue", "ping", "--queue", queue).out.strip()
    second = run("enqueue", "ping", "--queue", queue).out.strip()
    done = run(
        "enqueue",
        "ping",
        "--queue",
        queue,
        "--depends-on",
        first,
        "--depends-on",
        second,
        "--on-failure",
        "run",
    )
    assert done.code == 0, done.err
    waiting = Job.objects.get(pk=done.out.strip())
    assert waiting.run_after is None and waiting.waiting_for == 2
    rows = dependency_rows(waiting.pk)
    assert sorted(str(r["id"]) for r in rows) == sorted([first, second])
    assert {r["on_failure"] for r in rows} == {"run"}
    drain_jobs(queues=[queue])
    assert Job.objects.get(pk=waiting.pk).status == "succeeded"


@pytest.mark.django_db
def test_enqueue_refuses_an_unknown_dependency_and_a_bad_policy():
    ghost = run("enqueue", "ping", "--depends-on", str(uuid.uuid4()))
    assert ghost.code == 1 and "depends_on" in ghost.err, ghost
    bad = run("enqueue", "ping", "--depends-on", "nope")
    assert bad.code == 1 and "depends_on" in bad.err, bad
    policy = run("enqueue", "ping", "--on-failure", "explode")
    assert policy.code != 0 and "invalid choice" in policy.err
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_real_processes_exit_codes(subprocess_env, tmp_path):
    def start(*args: str, stdin: str | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=subprocess_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc.stdin_text = stdin  # type: ignore[attr-defined]
        return proc

    def done(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        out, err = proc.communicate(proc.stdin_text, timeout=60)  # type: ignore[attr-defined]
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def manage(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return done(start(*args, stdin=stdin))

    # The refusals need nothing from each other: they run at once, beside the rest.
    refused_p = start("workflow", "start", "-", stdin='{"steps": [{"operation": "nope.op"}]}')
    usage_p = start("workflow", "frobnicate")
    ghost_p = start("workflow", "cancel", str(uuid.uuid4()))
    depends_p = start("enqueue", "ping", "--depends-on", str(uuid.uuid4()))
    started = manage("workflow", "start", "-", stdin=json.dumps(spec(unique_queue())))
    assert started.returncode == 0, started.stderr
    workflow_id = started.stdout.strip()
    assert Workflow.objects.filter(pk=workflow_id).exists()
    shown = manage("workflow", "show", workflow_id, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == workflow_id
    refused = done(refused_p)
    assert refused.returncode == 2 and "steps.0.operation" in refused.stderr
    assert "Traceback" not in refused.stderr
    usage = done(usage_p)
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    ghost = done(ghost_p)
    assert ghost.returncode == 1 and "No workflow with id" in ghost.stderr
    cancelled = manage("workflow", "cancel", workflow_id, "--reason", "done")
    assert cancelled.returncode == 0, cancelled.stderr
    assert Workflow.objects.get(pk=workflow_id).status == "cancelled"
    depends = done(depends_p)
    assert depends.returncode == 1 and "Traceback" not in depends.stderr
