"""A ``django.tasks`` backend: any app's ``@task`` functions become jobs.

They are enqueued as the ``django.task`` operation, run by our workers,
shown in the dashboard like any job, and read back with ``get_result()``.
Configure it as ``TASKS = {"default": {"BACKEND": "jobs.tasks_backend.ControlPlaneTaskBackend"}}``.
"""

from __future__ import annotations

import builtins
import traceback
from typing import Any

from django.core.exceptions import ValidationError
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from jobs import exceptions as our_exceptions
from jobs.enqueue import enqueue
from jobs.exceptions import JobCancelled
from jobs.models import Job, JobEvent
from jobs.operations import JobContext, operation
from jobs.states import Status

OPERATION = "django.task"
# Written by run_django_task when the task raises: the exception's importable
# class path in ``fields`` and the full traceback as the message.
ERROR_EVENT = "task.error"

_STATUS = {
    Status.QUEUED: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}


class ControlPlaneTaskBackend(BaseTaskBackend):
    supports_defer = True
    supports_priority = True
    supports_get_result = True

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        job = enqueue(
            OPERATION,
            {
                "path": task.module_path,
                "args": list(args),
                "kwargs": dict(kwargs),
                "takes_context": task.takes_context,
                "backend": self.alias,
            },
            queue=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
        )
        return _task_result(job, task, self.alias)

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job = Job.objects.get(pk=result_id, operation=OPERATION)
        except (Job.DoesNotExist, ValidationError, ValueError) as error:
            raise TaskResultDoesNotExist(result_id) from error
        task = import_string(job.payload["path"])
        return _task_result(job, task, self.alias)


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
    last = (
        JobEvent.objects.filter(job_id=job.pk, event__in=(ERROR_EVENT, "job.started"))
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


def _task_result(job: Job, task: Task, alias: str) -> TaskResult:
    errors = [_error_of(job)] if job.status == Status.FAILED else []
    result = TaskResult(
        task=task,
        id=str(job.pk),
        status=_STATUS[Status(job.status)],
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
    task = import_string(payload["path"])
    func = task.func if isinstance(task, Task) else task
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    try:
        if payload.get("takes_context"):
            job = Job.objects.get(pk=ctx.job_id)
            backend = payload.get("backend", "default")
            context = TaskContext(task_result=_task_result(job, task, backend))
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
