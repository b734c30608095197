"""Outcome signals and operation hooks from real worker and reaper processes, and WORKER_CLASS."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from django.test import Client

from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, Worker
from tests import signal_app
from tests.conftest import wait_for
from tests.factories import make_user
from tests.integration.engine.conftest import TEST_MODULES

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = f"{TEST_MODULES},tests.signal_app"


@pytest.fixture
def signal_log(tmp_path) -> Path:
    return tmp_path / "signals.jsonl"


@pytest.fixture
def in_process(signal_log):
    """The ``sig.*`` operations registered here too, so the test can enqueue them."""
    signal_app.install(signal_log)
    yield
    signal_app.uninstall()


def _env(signal_log: Path, **extra: str) -> dict[str, str]:
    return {"CONTROLPLANE_OPERATION_MODULES": MODULES, signal_app.LOG_ENV: str(signal_log), **extra}


def _entries(signal_log: Path, job: Job, kind: str | None = None) -> list[dict]:
    return [
        e
        for e in signal_app.read(signal_log)
        if e.get("job_id") == str(job.pk) and (kind is None or e["kind"] == kind)
    ]


def _kinds(signal_log: Path, job: Job) -> list[str]:
    return [e["kind"] for e in _entries(signal_log, job)]


def _status(job: Job) -> str:
    return Job.objects.get(pk=job.pk).status


def test_the_worker_sends_each_outcome_once_after_commit_and_survives_a_raising_receiver(
    start_process, signal_log, in_process
):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    oks = [enqueue("sig.ok", {"n": n}, queue=queue) for n in range(5)]
    failing = enqueue("sig.fail", queue=queue)
    worker = start_process(
        "runworker", "--queue", queue, "--concurrency", "4",
        env=_env(signal_log, **{signal_app.RAISE_ENV: "1"}),
    )  # fmt: skip
    wait_for(
        lambda: all(_status(j) == "succeeded" for j in oks) and _status(failing) == "failed",
        timeout=30,
        message="the jobs' outcomes",
    )
    wait_for(lambda: len(_entries(signal_log, failing)) >= 2, message="the failure's signals")
    for job in oks:
        [entry] = _entries(signal_log, job)
        assert entry["kind"] == "job_succeeded"
        assert entry["pid"] == worker.pid  # sent in the process that made the change
        assert (entry["operation"], entry["queue"], entry["status"]) == (
            "sig.ok",
            queue,
            "succeeded",
        )
        assert entry["attempt"] == 1 and entry["result"] == {"n": oks.index(job)}
        assert entry["in_atomic"] is False and entry["stored"] == "succeeded"
    retry, failed = _entries(signal_log, failing)
    assert (retry["kind"], retry["attempt"], retry["error_code"]) == (
        "job_retry_scheduled",
        1,
        "ValueError",
    )
    assert retry["status"] == "queued" and retry["event"] == "job.retry_scheduled"
    assert (failed["kind"], failed["attempt"], failed["error_code"]) == (
        "job_failed",
        2,
        "ValueError",
    )
    assert failed["stored"] == "failed" and failed["event"] == "job.failed"
    # The raising receiver was logged and changed nothing; the worker goes on serving.
    assert "signal.receiver_failed" in worker.output()
    later = enqueue("sig.ok", {"n": 9}, queue=queue)
    wait_for(lambda: _kinds(signal_log, later) == ["job_succeeded"], message="a later job's signal")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    for job in [*oks, later]:
        assert _kinds(signal_log, job) == ["job_succeeded"]  # never twice


def test_operation_hooks_run_once_in_the_worker_for_final_outcomes_only(
    start_process, signal_log, in_process
):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    fn_ok = enqueue("sig.hooked", queue=queue)
    fn_fail = enqueue("sig.hooked", {"fail": True}, queue=queue)
    cls_ok = enqueue("sig.hooked_class", {"hook_raises": True}, queue=queue)
    cls_fail = enqueue("sig.hooked_class", {"fail": True}, queue=queue)
    retried = enqueue("sig.fail", queue=queue)  # no hooks: a retry runs none either
    worker = start_process(
        "runworker", "--queue", queue, "--concurrency", "2", env=_env(signal_log)
    )
    jobs = [fn_ok, fn_fail, cls_ok, cls_fail, retried]
    wait_for(
        lambda: (
            [_status(j) for j in jobs] == ["succeeded", "failed", "succeeded", "failed", "failed"]
        ),
        timeout=30,
        message="the hooked jobs' outcomes",
    )
    wait_for(lambda: len(_entries(signal_log, cls_fail)) >= 2, message="the last hook")
    assert _kinds(signal_log, fn_ok) == ["job_succeeded", "hook.on_success"]
    [hook] = _entries(signal_log, fn_ok, "hook.on_success")
    assert hook["result"] == {"hooked": True} and hook["pid"] == worker.pid
    assert _kinds(signal_log, fn_fail) == ["job_failed", "hook.on_failure"]
    [hook] = _entries(signal_log, fn_fail, "hook.on_failure")
    assert (hook["code"], hook["message"]) == ("RuntimeError", "hooked failure")
    assert _kinds(signal_log, cls_ok) == ["job_succeeded", "hook.class_success"]
    assert _kinds(signal_log, cls_fail) == ["job_failed", "hook.class_failure"]
    # A hook that raises is logged; the job stays succeeded and the worker serves on.
    assert "operation.hook_failed" in worker.output() and _status(cls_ok) == "succeeded"
    later = enqueue("sig.hooked", queue=queue)
    wait_for(lambda: "hook.on_success" in _kinds(signal_log, later), message="a later hook")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def test_the_reaper_sends_the_rescues_it_writes(start_process, signal_log, in_process):
    queue = f"q-{uuid.uuid4().hex[:8]}"  # served by no worker
    job = enqueue("sig.ok", queue=queue)
    env = {**_env(signal_log), "CONTROLPLANE_MAX_LEASE_REQUEUES": "1"}
    reaper = start_process("reaper", "--interval", "0.1", env=env)
    wait_for(lambda: "reaper.pass" in reaper.output(), message="the reaper passing")
    ghost = uuid.uuid4()
    for final in ("queued", "failed"):
        assert len(claim_jobs(queues=[queue], worker_id=ghost, limit=1, lease_seconds=0.3)) == 1
        wait_for(lambda f=final: _status(job) == f, timeout=20, message=f"the job {final}")
    wait_for(lambda: len(_entries(signal_log, job)) >= 2, message="the rescues' signals")
    requeued, failed = _entries(signal_log, job)
    assert (requeued["kind"], requeued["event"], requeued["attempt"]) == (
        "job_requeued",
        "job.lease_expired_requeue",
        1,
    )
    assert (failed["kind"], failed["event"], failed["error_code"]) == (
        "job_failed",
        "job.lease_expired",
        "LeaseExpired",
    )
    assert {requeued["pid"], failed["pid"]} == {reaper.pid}
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0
    assert len(_entries(signal_log, job)) == 2


# --- WORKER_CLASS and NotNow --------------------------------------------------------------

HOLDING = {"CONTROLPLANE_WORKER_CLASS": "tests.signal_app.HoldingWorker"}


def _workers_page() -> str:
    client = Client()
    client.force_login(make_user("operator"))
    response = client.get("/dashboard/workers/")
    assert response.status_code == 200
    return response.content.decode()


def _workers_json() -> list[dict]:
    client = Client()
    client.force_login(make_user("viewer"))
    response = client.get("/workers")
    assert response.status_code == 200, response.content[:300]
    return response.json()


@pytest.mark.parametrize("processes", [1, 2])
def test_worker_class_holds_off_claiming_when_pre_dequeue_says_not_now(
    start_process, signal_log, processes
):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    jobs = [enqueue("ping", queue=queue) for _ in range(4)]
    args = ["runworker", "--queue", queue, "--concurrency", "2"]
    if processes > 1:
        args += ["--processes", str(processes)]
    hold = 2.5
    worker = start_process(
        *args, env={**_env(signal_log), **HOLDING, signal_app.HOLD_ENV: str(hold)}
    )
    holding = wait_for(
        lambda: list(Worker.objects.exclude(holding_reason="")) or None,
        timeout=20,
        message="a worker row holding off",
    )
    wait_for(
        lambda: Worker.objects.exclude(holding_reason="").count() == processes,
        message="every worker holding off",
    )
    assert holding[0].holding_reason == signal_app.HOLD_REASON
    assert holding[0].holding_until is not None
    page = _workers_page()
    assert "holding off" in page
    assert "maintenance window &lt;b&gt;&#x27;db upgrade&#x27;&lt;/b&gt;" in page
    assert "<b>'db upgrade'</b>" not in page
    assert holding[0].holding_until.strftime("%H:%M:%S") in page
    shown = {w["id"]: w for w in _workers_json()}[str(holding[0].pk)]
    assert shown["holding_reason"] == signal_app.HOLD_REASON and shown["holding_until"]
    # Held: nothing is claimed while the hold lasts.
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status="queued").count() == 4
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in jobs], status="succeeded").count() == 4,
        timeout=30,
        message="the jobs run after the hold",
    )
    holds = [e for e in signal_app.read(signal_log) if e["kind"] == "hold"]
    assert len(holds) == processes
    first_hold = min(e["at"] for e in holds)
    started = min(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("started_at", flat=True)
    )
    assert started.timestamp() >= first_hold + hold - 0.3, (started.timestamp(), first_hold)
    wait_for(
        lambda: not Worker.objects.exclude(holding_reason="").exists(),
        message="the hold cleared from the rows",
    )
    assert "holding off" not in _workers_page()
    assert all(w["holding_until"] is None and not w["holding_reason"] for w in _workers_json())
    assert "worker.holding_off" in worker.output() and "worker.holding_ended" in worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0


def test_a_held_worker_stops_at_once_on_sigterm(start_process, signal_log):
    queue = f"q-{uuid.uuid4().hex[:8]}"
    worker = start_process(
        "runworker", "--queue", queue,
        env={**_env(signal_log), **HOLDING, signal_app.HOLD_ENV: "600"},
    )  # fmt: skip
    wait_for(lambda: Worker.objects.exclude(holding_reason="").exists(), message="holding off")
    began = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
    assert time.monotonic() - began < 5
    assert not Worker.objects.exists()


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("tests.signal_app.NoSuchWorker", "cannot be imported"),
        ("tests.signal_app.NotAWorker", "not a subclass of workers.engine.JobWorker"),
    ],
)
@pytest.mark.parametrize("processes", [0, 2])
def test_a_bad_worker_class_stops_runworker_with_a_clear_error(
    start_process, path, words, processes
):
    args = ["runworker", "--queue", "default"]
    if processes:
        args += ["--processes", str(processes)]
    worker = start_process(*args, env={"CONTROLPLANE_WORKER_CLASS": path})
    assert worker.wait(timeout=30) != 0
    output = worker.output()
    assert words in output and path in output, output[-2000:]
    assert not Worker.objects.exists()
