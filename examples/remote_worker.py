"""A remote worker: runs jobs on a machine that cannot reach the control plane's database.

Needs only the client package (``pip install './clients/python[push]'``
or just ``httpx``; ``websockets`` adds push wake-ups). Give it a token of a
user holding the ``controlplane.run_remote_jobs`` permission::

    python manage.py drf_create_token alice      # on the control plane

    CONTROLPLANE_URL=http://127.0.0.1:8000 CONTROLPLANE_TOKEN=<key> \\
        python examples/remote_worker.py            # auto-serve until Ctrl-C
    ... python examples/remote_worker.py --manual   # the same, claiming by hand

Then enqueue from anywhere, e.g.
``curl -H "Authorization: Token <key>" -H "Content-Type: application/json"
-d '{"operation": "thumbnail", "payload": {"url": "https://example.com/a.png"}}'
http://127.0.0.1:8000/jobs`` (the enqueuing user needs ``controlplane.add_job``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from controlplane_client import ClaimedJob, Deferred, JobManager, RetryableError, TokenApi

THUMBNAIL_SCHEMA = {
    "type": "object",
    "required": ["url"],
    "properties": {"url": {"type": "string"}, "size": {"type": "integer", "minimum": 1}},
}


def thumbnail(job: ClaimedJob) -> dict[str, Any]:
    """Pretend to make a thumbnail, reporting progress and stopping if cancelled."""
    steps = 5
    for step in range(1, steps + 1):
        if job.wait_cancelled(0.2):  # cancelled by an operator, or lease lost
            return {}
        job.progress(step, steps, f"step {step} of {steps}")
    if job.payload["url"].startswith("http://flaky"):
        raise RetryableError("The image server timed out.", error_code="Timeout")
    return {"thumbnail": job.payload["url"] + "?size=" + str(job.payload.get("size", 128))}


def report(job: ClaimedJob) -> Deferred:
    """A coordinator: its job stays running (deferred) until other work closes it."""
    job.emit("report.dispatched", "batches handed to the write queue", batches=3)
    return Deferred({"batches": 3})


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    url = os.environ.get("CONTROLPLANE_URL", "http://127.0.0.1:8000")
    # A callable token is read on every request: refresh it here if it rotates.
    api = TokenApi(url, token=lambda: os.environ["CONTROLPLANE_TOKEN"])
    manual = "--manual" in sys.argv

    with JobManager(api, name="example-worker", concurrency=2) as manager:
        # Declared here, so the control plane accepts (and validates) these jobs
        # for as long as a worker provides them.
        if manual:
            manager.declare(
                "thumbnail", queue="images", payload_schema=THUMBNAIL_SCHEMA, max_attempts=3
            )
            for job in manager.listen():  # blocks; Ctrl-C to stop
                manager.start(job)  # optional: claiming already started it
                try:
                    manager.complete(job, thumbnail(job))
                except Exception as error:  # noqa: BLE001
                    manager.fail(job, error)  # retryable if the error says so
            return 0

        manager.operation(
            "thumbnail", queue="images", payload_schema=THUMBNAIL_SCHEMA, max_attempts=3
        )(thumbnail)
        manager.operation("report", queue="images")(report)
        manager.wait()  # serves until SIGINT/SIGTERM, then disconnects gracefully
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # manual mode: the context manager has disconnected
        sys.exit(0)
