"""The remote worker's WebSocket: ``/ws/workers/<id>`` pushes ``job.available``.

A hint only: the worker claims over HTTP when it hears one, and polls anyway,
so a lost push costs latency, never a job. The socket joins one Channels
group per queue of the worker; the per-process relay (``django_controlplane.remote.relay``)
sends to those groups.

Authentication, in order of preference:

* ``Authorization: Token <key>`` on the handshake (the Python client sends
  this);
* ``?token=<key>`` in the URL, for non-browser clients that cannot set
  headers. URLs end up in proxy and access logs, so a token sent this way
  should be treated as exposed wherever those logs are readable;
* the session cookie (a logged-in browser), which always comes with an
  ``Origin`` header.

The handshake passes ``django_controlplane.remote.origin.TokenOrOriginValidator`` first: a
request with an ``Origin`` header must come from an allowed host; one
without (typical of non-browser clients) is let in only with a token, and
its cookies are dropped, so it can never ride on a session.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from django_controlplane.remote.errors import WorkerNotFound
from django_controlplane.remote.origin import token_from_scope
from django_controlplane.remote.relay import queue_group, relay
from django_controlplane.remote.workers import get_remote_worker

PERMISSION = "controlplane.run_remote_jobs"


@database_sync_to_async
def _authorised_worker(scope: dict[str, Any], worker_id: str) -> Any:
    """The worker this socket may listen for, or None."""
    from rest_framework.authtoken.models import Token

    key = token_from_scope(scope)
    user = None
    if key:
        token = Token.objects.select_related("user").filter(key=key).first()
        user = token.user if token and token.user.is_active else None
    else:
        session_user = scope.get("user")
        user = session_user if session_user is not None and session_user.is_authenticated else None
    if user is None or not user.has_perm(PERMISSION):
        return None
    try:
        return get_remote_worker(worker_id, user=user)
    except WorkerNotFound:
        return None


class WorkerConsumer(AsyncJsonWebsocketConsumer):
    """Tells one remote worker when a job may be claimable on one of its queues."""

    queues: list[str]

    async def connect(self) -> None:
        self.queues = []
        worker = await _authorised_worker(
            self.scope, self.scope["url_route"]["kwargs"]["worker_id"]
        )
        if worker is None:
            await self.close()  # before accept: the handshake is refused (403)
            return
        self.queues = list(worker.queues)
        for queue in self.queues:
            await self.channel_layer.group_add(queue_group(queue), self.channel_name)
        relay.subscribe_groups(self.queues, asyncio.get_running_loop())
        await self.accept()
        await self.send_json({"type": "hello", "worker": str(worker.pk), "queues": self.queues})

    async def disconnect(self, code: int) -> None:
        if not self.queues:
            return
        relay.unsubscribe_groups(self.queues)
        for queue in self.queues:
            await self.channel_layer.group_discard(queue_group(queue), self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def job_available(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "job.available", "queue": event["queue"]})
