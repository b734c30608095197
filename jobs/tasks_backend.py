"""A ``django.tasks`` backend: any app's ``@task`` functions become jobs.

They are enqueued as the ``django.task`` operation, run by our workers,
shown in the dashboard like any job, and read back with ``get_result()``.
Configure it as ``TASKS = {"default": {"BACKEND": "jobs.tasks_backend.ControlPlaneTaskBackend"}}``.
"""

from __future__ import annotations

import traceback
from typing import Any

from django.core.exceptions import ValidationError
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from jobs.enqueue import enqueue
from jobs.models import Job
from jobs.operations import JobContext, operation
from jobs.states import Status

OPERATION = "django.task"

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


def _task_result(job: Job, task: Task, alias: str) -> TaskResult:
    errors = []
    if job.status == Status.FAILED:
        errors.append(
            TaskError(exception_class_path=job.error_code or "Exception", traceback=job.error_message)
        )
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
    """Runs a django.tasks @task function by its import path."""
    task = import_string(payload["path"])
    func = task.func if isinstance(task, Task) else task
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if payload.get("takes_context"):
        job = Job.objects.get(pk=ctx.job_id)
        context = TaskContext(task_result=_task_result(job, task, payload.get("backend", "default")))
        return func(context, *args, **kwargs)
    try:
        return func(*args, **kwargs)
    except Exception:
        ctx.emit("task.error", traceback.format_exc(limit=20), level="error")
        raise
