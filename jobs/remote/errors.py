"""Errors of the remote-worker protocol, each carrying the HTTP status it maps to."""

from __future__ import annotations

from jobs.exceptions import ControlPlaneError


class RemoteRequestError(ControlPlaneError):
    """A remote worker's request was refused; ``errors`` maps fields to messages."""

    status_code = 400

    def __init__(self, message: str, errors: dict[str, list[str]] | None = None) -> None:
        self.message = message
        self.errors = errors or {}
        super().__init__(message)


class WorkerNotFound(RemoteRequestError):
    """No remote worker of this user has that id: never registered, disconnected or swept."""

    status_code = 404

    def __init__(self, worker_id: object) -> None:
        super().__init__(
            f"No remote worker with id {worker_id} is registered for you (it disconnected or "
            "was swept after missing heartbeats); register again with POST /workers."
        )
