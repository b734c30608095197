"""Python client for the control plane's remote-worker protocol.

Runs jobs on machines that cannot reach the database: it needs only
``httpx`` (and, optionally, ``websockets`` for push wake-ups), never Django.

    from controlplane_client import JobManager, TokenApi

    api = TokenApi("https://jobs.example.com", token="…")
    with JobManager(api, concurrency=4) as manager:

        @manager.operation("thumbnail", queue="images",
                           payload_schema={"type": "object", "required": ["url"]})
        def thumbnail(job):
            job.progress(1, 2)
            return {"ok": True}

        manager.wait()  # serves until SIGINT/SIGTERM, then disconnects gracefully

See ``examples/remote_worker.py`` for both modes. ``Client`` enqueues jobs and
workflows and waits for their results (``client.result(job_id, timeout)``).
"""

from controlplane_client.api import (
    ApiError,
    ApiManager,
    JobCancelledError,
    LeaseLostError,
    TokenApi,
    WorkerGoneError,
)
from controlplane_client.client import (
    Client,
    JobFailedError,
    JobNotSucceededError,
    JobWasCancelledError,
    WaitTimeoutError,
)
from controlplane_client.jobs import ClaimedJob, Deferred, RetryableError
from controlplane_client.logs import JobLogHandler, capture_logging
from controlplane_client.manager import JobManager

__all__ = [
    "ApiError",
    "ApiManager",
    "ClaimedJob",
    "Client",
    "Deferred",
    "JobCancelledError",
    "JobFailedError",
    "JobLogHandler",
    "JobManager",
    "JobNotSucceededError",
    "JobWasCancelledError",
    "LeaseLostError",
    "RetryableError",
    "TokenApi",
    "WaitTimeoutError",
    "WorkerGoneError",
    "capture_logging",
]
