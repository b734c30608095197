"""A ``django.tasks`` backend: any app's ``@task`` functions become jobs.

They are enqueued as the ``django.task`` operation, run by our workers,
shown in the dashboard like any job, and read back with ``get_result()``.
Configure it as ``TASKS = {"default": {"BACKEND": "jobs.tasks_backend.ControlPlaneTaskBackend"}}``.
The operation and the reading of results are ``jobs.tasks_operation``
(imported here, so listing this module in ``OPERATION_MODULES`` still
registers the operation).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskResult
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from jobs.enqueue import enqueue
from jobs.models import Job
from jobs.tasks_operation import ERROR_EVENT, OPERATION, class_path, task_result

__all__ = ["ERROR_EVENT", "OPERATION", "ControlPlaneTaskBackend", "class_path", "task_result"]


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
        return task_result(job, task, self.alias)

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job = Job.objects.get(pk=result_id, operation=OPERATION)
        except (Job.DoesNotExist, ValidationError, ValueError) as error:
            raise TaskResultDoesNotExist(result_id) from error
        task = import_string(job.payload["path"])
        return task_result(job, task, self.alias)
