"""Worker hooks (Sourcegraph's PreDequeue / PreHandle / PostHandle), run in-process."""

from __future__ import annotations

import pytest

from jobs.enqueue import enqueue
from jobs.models import Job
from workers.config import WorkerConfig
from workers.engine import JobWorker

pytestmark = pytest.mark.django_db(transaction=True)


class BudgetWorker(JobWorker):
    """Declines to dequeue once its budget is spent; records what its hooks saw."""

    def __init__(self, *args, budget: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.budget = budget
        self.seen: list[tuple[str, str]] = []

    def pre_dequeue(self) -> bool:
        return self.budget > 0

    def pre_handle(self, job) -> None:
        self.budget -= 1
        self.seen.append(("pre", job.operation))

    def post_handle(self, job, outcome: str) -> None:
        self.seen.append(("post", outcome))


def test_hooks_run_around_each_job_and_pre_dequeue_can_decline():
    jobs = [enqueue("ping") for _ in range(3)]
    worker = BudgetWorker(
        WorkerConfig(queues=("default",), concurrency=1, burst=True, poll_seconds=0.05), budget=2
    )
    assert worker.run(install_signals=False) == 0
    statuses = sorted(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    )
    assert statuses == ["queued", "succeeded", "succeeded"]
    assert worker.seen == [("pre", "ping"), ("post", "succeeded")] * 2
