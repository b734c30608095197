"""Enqueue jobs and workflows over the REST API and wait for their ends: ``Client``.

    from controlplane_client import Client

    client = Client("https://jobs.example.com", token="…")
    job = client.enqueue("thumbnail", {"url": "…"})
    print(client.result(job["id"], timeout=300))   # its result, once it succeeded

    run = client.start_workflow({"name": "nightly", "steps": [
        {"name": "fetch", "operation": "fetch"},
        {"name": "merge", "operation": "merge", "depends_on": ["fetch"]}]})
    run = client.workflow(run["id"], wait=120)      # its JSON once it ended (or after 120 s)

Waiting uses the server's long-poll (``GET /jobs/<id>?wait=S``, at most 60 s
a request, holding no database connection there): a longer timeout is a loop
of long-polls, each as long as the time left allows. A 503 (the server busy)
is retried after its ``Retry-After`` within the timeout. Needs only ``httpx``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from controlplane_client.api import ApiError, ApiManager, TokenApi

__all__ = [
    "Client",
    "JobFailedError",
    "JobNotSucceededError",
    "JobWasCancelledError",
    "WaitTimeoutError",
]

MAX_WAIT_SECONDS = 60.0  # the server's longest long-poll
HTTP_MARGIN_SECONDS = 30.0  # the HTTP timeout of a long-poll: its wait and this
JOB_ENDED = frozenset({"succeeded", "failed", "cancelled"})
WORKFLOW_ENDED = frozenset({"succeeded", "failed", "cancelled"})


class WaitTimeoutError(TimeoutError):
    """The job (or workflow) had not ended when the timeout ran out; ``state`` is its JSON then."""

    def __init__(self, message: str, state: dict[str, Any]) -> None:
        super().__init__(message)
        self.state = state


class JobNotSucceededError(Exception):
    """The job ended without a result: ``job`` is its JSON (``status``, ``error_*``)."""

    def __init__(self, message: str, job: dict[str, Any]) -> None:
        super().__init__(message)
        self.job = job

    @property
    def status(self) -> str:
        return str(self.job.get("status", ""))


class JobFailedError(JobNotSucceededError):
    """The job failed: ``job["error_code"]`` and ``job["error_message"]`` say why."""


class JobWasCancelledError(JobNotSucceededError):
    """The job was cancelled (by an operator, or by a failed dependency: see its timeline)."""


class Client:
    """The REST API for programs that enqueue and wait (no Django, no database).

    ``server`` is the API's root URL (with ``token``) or an ``ApiManager``
    (``TokenApi`` or your own, for other authentication).
    """

    def __init__(
        self, server: str | ApiManager, token: str | Callable[[], str] | None = None
    ) -> None:
        self.api: ApiManager = TokenApi(server, token) if isinstance(server, str) else server
        self._owned = isinstance(server, str)

    def close(self) -> None:
        if self._owned and isinstance(self.api, TokenApi):
            self.api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs ---------------------------------------------------------------------

    def enqueue(
        self, operation: str, payload: dict[str, Any] | None = None, **options: Any
    ) -> dict[str, Any]:
        """``POST /jobs``: the new job's JSON. ``options``: ``queue``, ``priority``,
        ``depends_on`` (job ids), ``on_failure`` … as the API takes them."""
        body = {"operation": operation, "payload": payload or {}, **options}
        return self._send("POST", "/jobs", json=body)

    def job(self, job_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """``GET /jobs/<id>``; with ``wait``, once it ends or after ``wait`` seconds
        (any length: longer than 60 s is several long-polls)."""
        if wait is None:
            return self._send("GET", f"/jobs/{job_id}")
        return self._wait(f"/jobs/{job_id}", JOB_ENDED, wait)

    def wait(self, job_id: str, timeout: float) -> dict[str, Any]:
        """The job's JSON once it has ended (succeeded, failed or cancelled);
        ``WaitTimeoutError`` (with its state then) when ``timeout`` seconds pass first."""
        job = self.job(job_id, wait=timeout)
        if job.get("status") not in JOB_ENDED:
            raise WaitTimeoutError(
                f"Job {job_id} had not ended after {timeout:g} s (it is {job.get('status')}).",
                job,
            )
        return job

    def result(self, job_id: str, timeout: float) -> Any:
        """The result of the job once it succeeded. ``JobFailedError`` or
        ``JobWasCancelledError`` when it ended otherwise; ``WaitTimeoutError`` on timeout."""
        job = self.wait(job_id, timeout)
        status = job.get("status")
        if status == "succeeded":
            return job.get("result")
        if status == "failed":
            raise JobFailedError(
                f"Job {job_id} failed: {job.get('error_code') or 'error'}: "
                f"{job.get('error_message') or ''}".rstrip(": "),
                job,
            )
        raise JobWasCancelledError(f"Job {job_id} was cancelled.", job)

    # --- workflows ------------------------------------------------------------------

    def start_workflow(self, spec: dict[str, Any]) -> dict[str, Any]:
        """``POST /workflows``: the workflow's JSON (``id``, ``status``, ``steps``…).
        ``ApiError`` with ``errors`` by field (``steps.1.depends_on``) when it is refused."""
        return self._send("POST", "/workflows", json=spec)

    def workflow(self, workflow_id: str, wait: float | None = None) -> dict[str, Any]:
        """``GET /workflows/<id>``; with ``wait``, once it ends or after ``wait`` seconds."""
        if wait is None:
            return self._send("GET", f"/workflows/{workflow_id}")
        return self._wait(f"/workflows/{workflow_id}", WORKFLOW_ENDED, wait)

    def cancel_workflow(self, workflow_id: str, reason: str | None = None) -> dict[str, Any]:
        body = {"reason": reason} if reason else {}
        return self._send("POST", f"/workflows/{workflow_id}/cancel", json=body)

    # --- plumbing -------------------------------------------------------------------

    def _wait(self, path: str, ended: frozenset[str], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + max(0.0, float(timeout))
        state = self._send("GET", path)
        while state.get("status") not in ended:
            left = deadline - time.monotonic()
            if left < 0.01:
                break
            wait = min(MAX_WAIT_SECONDS, left)
            state = self._send(
                "GET",
                path,
                params={"wait": f"{wait:.3f}"},
                timeout=wait + HTTP_MARGIN_SECONDS,
                deadline=deadline,
            )
        return state

    def _send(
        self,
        method: str,
        path: str,
        *,
        deadline: float | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """One request; a 503 is tried again after its Retry-After (until ``deadline``)."""
        url = self.api.base_url + path
        while True:
            response = self.api.http.request(
                method,
                url,
                headers=self.api.get_headers(),
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                **kwargs,
            )
            if response.status_code == 503:
                pause = _retry_after(response)
                if deadline is not None and time.monotonic() + pause < deadline:
                    time.sleep(pause)
                    continue
            self.api.raise_for_status(response)
            if response.is_error:
                raise ApiError.from_response(response)
            return response.json()


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(10.0, max(0.1, float(response.headers.get("Retry-After", "1"))))
    except ValueError:
        return 1.0
