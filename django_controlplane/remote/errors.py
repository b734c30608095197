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


class OperationOwned(RemoteRequestError):
    """Another account declared these operations first; nothing was registered or changed.

    The account that first declares a remote operation owns it: only it (or a
    superuser) may declare it again, identically or not, or serve it. Another
    account serving an operation it does not own could claim its jobs and
    complete them with forged results.
    """

    status_code = 409

    def __init__(self, owned: Sequence[tuple[int, str, str]]) -> None:
        """``owned``: (index in ``operations``, name, owner's username) of each refused one."""
        named = ", ".join(f"{name!r} (owner: {owner})" for _, name, owner in owned)
        super().__init__(
            f"The worker was not registered: {named} "
            f"{'is' if len(owned) == 1 else 'are'} declared by another account, which owns "
            f"{'it' if len(owned) == 1 else 'them'}. Only the owner or an administrator may "
            "declare or serve an operation; choose another name, or register with the "
            "owner's account.",
            {
                f"operations.{index}.name": [f"Operation {name!r} is owned by {owner}."]
                for index, name, owner in owned
            },
        )


class LocalOperationRefused(RemoteRequestError):
    """The registration names local or built-in operations, which remote workers do not serve."""

    status_code = 403

    def __init__(self, refused: Sequence[tuple[int, str]]) -> None:
        """``refused``: (index in ``operations``, name) of each local operation named."""
        names = [name for _, name in refused]
        listed = ", ".join(repr(n) for n in names)
        super().__init__(
            f"The worker was not registered: {listed} "
            f"{'is a local operation' if len(names) == 1 else 'are local operations'} "
            "(built in or defined in this project), which remote workers may not serve "
            "unless REMOTE_MAY_SERVE_LOCAL is set. Declare operations of your own.",
            {
                f"operations.{index}.name": ["Local operations are not served remotely."]
                for index, _ in refused
            },
        )


class NotGranted(RemoteRequestError):
    """``REMOTE_WORKER_GRANTS`` does not allow this account what the registration names.

    Nothing was registered or changed: no worker row, no declaration.
    """

    status_code = 403

    def __init__(
        self,
        username: str,
        *,
        listed: bool,
        operations: Sequence[tuple[str, str]] = (),
        queues: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``operations``/``queues``: (field in the body, name) of each one not granted."""
        if not listed:
            message = (
                f"The worker was not registered: account {username!r} may serve no operation "
                "or queue; REMOTE_WORKER_GRANTS lists neither it nor any of its groups. "
                "Ask an administrator to grant it the operations and queues it serves."
            )
            super().__init__(
                message, {"operations": [f"REMOTE_WORKER_GRANTS grants {username!r} nothing."]}
            )
            return
        parts = []
        ops = list(dict.fromkeys(name for _, name in operations))
        qs = list(dict.fromkeys(name for _, name in queues))
        if ops:
            parts.append(
                f"operation{'s' if len(ops) > 1 else ''} {', '.join(repr(n) for n in ops)}"
            )
        if qs:
            parts.append(f"queue{'s' if len(qs) > 1 else ''} {', '.join(repr(n) for n in qs)}")
        message = (
            f"The worker was not registered: account {username!r} may not serve "
            f"{' or '.join(parts)} (REMOTE_WORKER_GRANTS allows it other operations and "
            "queues). Register without them, or ask an administrator to grant them."
        )
        errors: dict[str, list[str]] = {}
        for field, name in operations:
            errors.setdefault(field, []).append(
                f"Operation {name!r} is not granted to {username} (REMOTE_WORKER_GRANTS)."
            )
        for field, name in queues:
            errors.setdefault(field, []).append(
                f"Queue {name!r} is not granted to {username} (REMOTE_WORKER_GRANTS)."
            )
        super().__init__(message, errors)
