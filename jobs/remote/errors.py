"""Errors of the remote-worker protocol, each carrying the HTTP status it maps to."""

from __future__ import annotations

from collections.abc import Sequence

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


class LeaseNotYours(RemoteRequestError):
    """The lease token is the job's current one, but another account's worker claimed the job.

    A token alone is not enough: it may have leaked (a log, a proxy), and
    with it any remote-worker account could finish or fail someone else's
    job. Only the account that registered the claiming worker may report on
    the job or extend its lease. Nothing is changed.
    """

    status_code = 403

    def __init__(self, job_ids: Sequence[object]) -> None:
        named = ", ".join(str(i) for i in job_ids)
        noun = "Job" if len(job_ids) == 1 else "Jobs"
        super().__init__(
            f"{noun} {named} {'was' if len(job_ids) == 1 else 'were'} claimed by a worker "
            "another account registered; only that account may report on "
            f"{'it' if len(job_ids) == 1 else 'them'} or extend the lease. Claim jobs with "
            "this account's own worker.",
            {"lease_token": ["This lease belongs to a worker of another account."]},
        )
