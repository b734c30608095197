"""Remote workers over HTTP: the services described in docs/remote-workers.md.

Workers that cannot reach the database register, heartbeat, claim and report
through the REST API; these plain functions do the work, the views in
``django_controlplane.remote.views`` only parse and render. The modules:

* ``workers`` -- register (with operation declarations), heartbeat, disconnect;
* ``runs`` -- claim with long-poll, events, complete, fail (token-fenced);
* ``relay`` -- the one per-process wake-up source for long-polls and WebSockets;
* ``grants`` -- ``REMOTE_WORKER_GRANTS``, which operations and queues each account serves.
"""

from __future__ import annotations

from django_controlplane.remote.errors import NotGranted, RemoteRequestError, WorkerNotFound
from django_controlplane.remote.grants import grant_for
from django_controlplane.remote.runs import (
    MAX_WAIT_SECONDS,
    claim,
    complete,
    fail,
    post_event,
    retry_backoff,
)
from django_controlplane.remote.workers import (
    HeartbeatResult,
    disconnect_worker,
    get_remote_worker,
    heartbeat,
    register_worker,
)

__all__ = [
    "MAX_WAIT_SECONDS",
    "HeartbeatResult",
    "NotGranted",
    "RemoteRequestError",
    "WorkerNotFound",
    "claim",
    "complete",
    "disconnect_worker",
    "fail",
    "get_remote_worker",
    "grant_for",
    "heartbeat",
    "post_event",
    "register_worker",
    "retry_backoff",
]
