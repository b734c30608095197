"""HTTP plumbing of the client: the ``ApiManager`` protocol, a token implementation, errors.

The ``JobManager`` sends every request through an ``ApiManager``: its
``get_headers()`` is called on every request, so a token that expires can be
refreshed there, and ``raise_for_status()`` is the host's hook for error
handling (the manager still raises ``ApiError`` for any non-2xx it is handed back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import httpx

__all__ = [
    "ApiError",
    "ApiManager",
    "JobCancelledError",
    "LeaseLostError",
    "TokenApi",
    "WorkerGoneError",
]


@runtime_checkable
class ApiManager(Protocol):
    """What the ``JobManager`` needs to talk to the control plane."""

    http: httpx.Client

    def get_headers(self) -> dict[str, str]:
        """Headers for one request (authentication); called on every request."""
        ...

    @property
    def base_url(self) -> str:
        """The server's root URL, e.g. ``https://jobs.example.com``."""
        ...

    def raise_for_status(self, response: httpx.Response) -> None:
        """Raise (or log) for a non-2xx response."""
        ...


class ApiError(Exception):
    """The server refused a request; ``message`` and ``errors`` come from its one error shape."""

    def __init__(
        self, status_code: int, message: str, errors: dict[str, list[str]] | None = None
    ) -> None:
        self.status_code = status_code
        self.message = message
        self.errors = errors or {}
        super().__init__(f"{status_code}: {message}" + (f" {self.errors}" if self.errors else ""))

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        try:
            body: Any = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        message = str(body.get("message") or body.get("detail") or response.reason_phrase)
        errors = body.get("errors") if isinstance(body.get("errors"), dict) else {}
        if response.status_code == 409:
            status = (errors.get("status") or [""])[0]
            kind = JobCancelledError if status == "cancelled" else LeaseLostError
            return kind(response.status_code, message, errors)
        return cls(response.status_code, message, errors)


class LeaseLostError(ApiError):
    """409: this worker no longer holds the job (requeued, reaped, given to another worker).

    Stop working on it; nothing this worker sends about it will be recorded.
    """

    @property
    def job_status(self) -> str:
        return (self.errors.get("status") or [""])[0]


class JobCancelledError(LeaseLostError):
    """409: the job was cancelled; stop working on it."""


class WorkerGoneError(ApiError):
    """404 on a worker route: the worker was disconnected or swept; register again."""


class TokenApi:
    """An ``ApiManager`` authenticating with ``Authorization: Token <key>``.

    ``token`` may be a string or a callable returning the current key (called
    on every request, so rotating keys works).
    """

    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], str] | None = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        http: httpx.Client | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._token = token
        self._headers = dict(headers or {})
        self.http = http or httpx.Client(timeout=timeout, trust_env=False)

    @property
    def base_url(self) -> str:
        return self._base_url

    def get_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", **self._headers}
        token = self._token() if callable(self._token) else self._token
        if token:
            headers["Authorization"] = f"Token {token}"
        return headers

    def raise_for_status(self, response: httpx.Response) -> None:
        if response.is_error:
            raise ApiError.from_response(response)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> TokenApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
