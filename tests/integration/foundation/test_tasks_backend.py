"""Django 6 ``@task`` functions through our backend, run in the test by ``drain_jobs``
(the worker's own claim, runner and completion); a real worker process runs them last."""

from __future__ import annotations

import uuid

import pytest
from django.tasks import default_task_backend, task, task_backends
from django.tasks.base import TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist

from django_controlplane.testing import JobRun, drain_jobs
from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job
from jobs.tasks_backend import OPERATION, ControlPlaneTaskBackend
from jobs.transitions import cancel_job, fail_job
from tests.factories import assert_consistent, fresh, timeline

pytestmark = pytest.mark.django_db

QUEUE = "tasks-under-test"


@task(queue_name=QUEUE)
def add(a, b):
    return a + b


@task(queue_name=QUEUE, priority=10)
def shout(text, *, times=1):
    return {"text": (text.upper() + "!") * times}


@task(queue_name=QUEUE)
def explode(message):
    raise ValueError(message)


@task(queue_name=QUEUE, takes_context=True)
def whoami(context, suffix):
    return f"{context.task_result.id}:{context.attempt}:{suffix}"


def run_one_job() -> JobRun:
    """The one task job enqueued, run once as a worker runs it: claim, ``django.task``, outcome."""
    [run] = drain_jobs(queues=[QUEUE]).runs
    assert (run.operation, run.attempt) == (OPERATION, 1)
    return run


def test_our_backend_is_the_default():
    assert isinstance(task_backends["default"], ControlPlaneTaskBackend)
    assert isinstance(add.get_backend(), ControlPlaneTaskBackend)


def test_enqueue_creates_a_job_and_get_result_reads_it_back():
    result = add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {}

    job = fresh(uuid.UUID(result.id))
    assert (job.operation, job.queue, job.status) == (OPERATION, QUEUE, "queued")
    assert job.payload["path"] == add.module_path
    assert job.payload["args"] == [2, 3]
    assert timeline(job) == [(1, "job.enqueued")]

    assert run_one_job().job_id == job.pk

    finished = add.get_result(result.id)
    assert finished.status == TaskResultStatus.SUCCESSFUL
    assert finished.return_value == 5
    assert finished.is_finished and finished.finished_at is not None
    assert finished.errors == []
    # The same through the backend, and through refresh().
    assert default_task_backend.get_result(result.id).return_value == 5
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_kwargs_priority_and_structured_results():
    result = shout.enqueue("hey", times=2)
    assert fresh(uuid.UUID(result.id)).priority == 10
    run_one_job()
    assert shout.get_result(result.id).return_value == {"text": "HEY!HEY!"}


def test_a_failing_task_is_failed():
    result = explode.enqueue("kaboom")
    run = run_one_job()
    assert run.outcome == "failed"
    failed = explode.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.is_finished
    assert len(failed.errors) == 1
    assert "kaboom" in failed.errors[0].traceback
    with pytest.raises(ValueError):
        failed.return_value  # noqa: B018 - the property raises for a failed task
    assert fresh(run.job_id).status == "failed"
    events = [e for _, e in assert_consistent(run.job_id)]
    assert events == ["job.enqueued", "job.started", "task.error", "job.failed"]


def test_a_task_that_takes_context():
    result = whoami.enqueue("x")
    run_one_job()
    assert whoami.get_result(result.id).return_value == f"{result.id}:1:x"


def test_running_and_cancelled_tasks_report_their_state():
    result = add.enqueue(1, 1)
    [held] = claim_jobs(queues=[QUEUE], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert add.get_result(result.id).status == TaskResultStatus.RUNNING
    cancel_job(held.id)
    assert add.get_result(result.id).status == TaskResultStatus.FAILED


@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), "not-a-uuid", ""])
def test_unknown_result_id(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_a_job_that_is_not_a_task_is_not_a_task_result():
    job = enqueue("ping")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(job.pk))
    assert Job.objects.filter(pk=job.pk).exists()


class TaskBroke(RuntimeError):
    """An exception class of this module: its path must come back importable."""


@task(queue_name=QUEUE)
def break_down(reason):
    raise TaskBroke(reason)


def test_a_failed_tasks_error_names_an_importable_class_and_the_real_traceback():
    result = explode.enqueue("kaboom")
    run_one_job()
    [error] = explode.get_result(result.id).errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last):")
    assert "raise ValueError(message)" in error.traceback
    assert error.traceback.rstrip().endswith("ValueError: kaboom")


def test_an_exception_class_of_the_tasks_own_module():
    result = break_down.enqueue("gears")
    run_one_job()
    [error] = break_down.get_result(result.id).errors
    assert error.exception_class is TaskBroke
    assert error.exception_class_path == f"{__name__}.TaskBroke"


@pytest.mark.parametrize(
    "code,path",
    [
        ("KeyError", "builtins.KeyError"),
        ("LeaseLost", "jobs.exceptions.LeaseLost"),
        ("WorkerShutdown", "builtins.Exception"),
    ],
)
def test_a_task_failed_outside_its_function_still_has_an_importable_class(code, path):
    """Failed by the engine (no task.error event): the error code maps to a real class."""
    result = add.enqueue(1, 2)
    [held] = claim_jobs(queues=[QUEUE], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    fail_job(held.id, lease_token=held.lease_token, error_code=code, error_message="gone")
    [error] = add.get_result(result.id).errors
    assert error.exception_class_path == path
    assert issubclass(error.exception_class, BaseException)
    assert error.traceback == f"{code}: gone"


@pytest.mark.django_db(transaction=True)
def test_tasks_run_by_a_real_worker_process(start_process):
    """``@task`` → a ``runworker --burst`` process → ``get_result()``, success and failure."""
    from pathlib import Path

    # The worker imports the tasks by their module path: put this module's root on its path.
    root = Path(__file__).resolve().parents[len(__name__.split(".")) - 1]
    ok = add.enqueue(20, 22)
    bad = explode.enqueue("from a real worker")
    proc = start_process("runworker", "--queue", QUEUE, "--burst", env={"PYTHONPATH": str(root)})
    assert proc.wait(timeout=120) == 0, proc.output()

    done = add.get_result(ok.id)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 42), proc.output()
    assert len(done.worker_ids) == 1
    failed = explode.get_result(bad.id)
    assert failed.status == TaskResultStatus.FAILED, proc.output()
    [error] = failed.errors
    assert error.exception_class is ValueError
    assert "ValueError: from a real worker" in error.traceback
    assert "Traceback (most recent call last):" in error.traceback
