"""The ``django.task`` operation, and how its jobs read as ``django.tasks`` results.

``jobs.tasks_backend`` (the backend ``django.tasks`` is configured with)
enqueues these jobs and reads them back through ``task_result``. The
operation lives apart from the backend so that registering it (every worker
does, at start-up) does not import ``django.tasks`` (about 2% of a worker's
start-up CPU): a worker imports it when it runs such a job.
"""

from __future__ import annotations

import builtins
import traceback
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from jobs import exceptions as our_exceptions
from jobs.events import JOB_STARTED
from jobs.exceptions import JobCancelled
from jobs.models import Job, JobEvent
from jobs.operations import JobContext, operation
from jobs.states import Status

if TYPE_CHECKING:
    from django.tasks.base import Task, TaskError, TaskResult

__all__ = ["ERROR_EVENT", "OPERATION", "class_path", "run_django_task", "task_result"]

OPERATION = "django.task"
# Written by run_django_task when the task raises: the exception's importable
# class path in ``fields`` and the full traceback as the message.
ERROR_EVENT = "task.error"

# django.tasks' name (TaskResultStatus) of each job status.
_STATUS = {
    Status.QUEUED: "READY",
    Status.RUNNING: "RUNNING",
    Status.SUCCEEDED: "SUCCESSFUL",
    Status.FAILED: "FAILED",
    Status.CANCELLED: "FAILED",
}


def class_path(cls: type) -> str:
    """The dotted path ``import_string`` resolves back to ``cls`` (``builtins.ValueError``)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _error_of(job: Job) -> TaskError:
    """The failure of the job's last attempt as django.tasks reports it.

    The ``task.error`` event of that attempt has the exception's class path
    and traceback. A job failed without one (lease expired, timeout, worker
    shutdown) reports its error code: the builtin or ``jobs.exceptions``
    class of that name when there is one, else ``builtins.Exception``.
    """
    from django.tasks.base import TaskError

    last = (
        JobEvent.objects.filter(job_id=job.pk, event__in=(ERROR_EVENT, JOB_STARTED))
        .order_by("-seq")
        .values_list("event", "message", "fields")
        .first()
    )
    if last and last[0] == ERROR_EVENT and isinstance(last[2], dict):
        path = last[2].get("exception_class")
        if isinstance(path, str) and "." in path:
            return TaskError(exception_class_path=path, traceback=last[1])
    code = job.error_code
    if isinstance(getattr(builtins, code, None), type) and issubclass(
        getattr(builtins, code), BaseException
    ):
        path = f"builtins.{code}"
    elif isinstance(getattr(our_exceptions, code, None), type):
        path = f"jobs.exceptions.{code}"
    else:
        path = "builtins.Exception"
    text = f"{code}: {job.error_message}" if code else job.error_message
    return TaskError(exception_class_path=path, traceback=text)


def task_result(job: Job, task: Task, alias: str) -> TaskResult:
    """The job as django.tasks shows a task's result (also the context of a running task)."""
    from django.tasks.base import TaskResult, TaskResultStatus

    errors = [_error_of(job)] if job.status == Status.FAILED else []
    result = TaskResult(
        task=task,
        id=str(job.pk),
        status=TaskResultStatus[_STATUS[Status(job.status)]],
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=job.payload.get("args", []),
        kwargs=job.payload.get("kwargs", {}),
        backend=alias,
        errors=errors,
        worker_ids=[str(job.worker_id)] * job.attempts if job.worker_id else [],
    )
    if job.status == Status.SUCCEEDED:
        object.__setattr__(result, "_return_value", job.result)
    return result


@operation(
    OPERATION,
    payload_schema={
        "type": "object",
        "required": ["path"],
        "properties": {
            "path": {"type": "string"},
            "args": {"type": "array"},
            "kwargs": {"type": "object"},
            "takes_context": {"type": "boolean"},
            "backend": {"type": "string"},
        },
    },
)
def run_django_task(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Runs a django.tasks @task function by its import path.

    When it raises, a ``task.error`` event records the exception's class
    path and traceback for ``get_result().errors`` before the worker fails
    (or retries) the job.
    """
    from django.tasks.base import Task, TaskContext

    task = import_string(payload["path"])
    func = task.func if isinstance(task, Task) else task
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    try:
        if payload.get("takes_context"):
            job = Job.objects.get(pk=ctx.job_id)
            backend = payload.get("backend", "default")
            context = TaskContext(task_result=task_result(job, task, backend))
            return func(context, *args, **kwargs)
        return func(*args, **kwargs)
    except JobCancelled:
        raise
    except Exception as error:
        # Storable on both databases whatever the exception's text holds.
        text = traceback.format_exc().replace("\x00", "\\x00")
        ctx.emit(
            ERROR_EVENT,
            text.encode("utf-8", "backslashreplace").decode("utf-8"),
            level="error",
            exception_class=class_path(type(error)),
        )
        raise
