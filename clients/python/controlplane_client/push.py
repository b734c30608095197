"""Real-time wake-ups over the worker WebSocket (``/ws/workers/<id>``).

Optional: it needs the ``websockets`` package (``pip install
django-controlplane[client]``). Without it, or while the socket is down, the
manager simply polls; a push is a hint to claim now, never the only way a
job is found.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("controlplane_client")

ws_connect: Callable[..., Any] | None
try:  # pragma: no cover - exercised by whether the extra is installed
    from websockets.sync.client import connect as ws_connect
except ImportError:  # pragma: no cover
    ws_connect = None

AVAILABLE = ws_connect is not None


def websocket_url(base_url: str, worker_id: str) -> str:
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/')}/ws/workers/{worker_id}"


class PushListener:
    """A daemon thread holding the worker's socket; calls ``on_available`` per push.

    Reconnects with backoff; ``connected`` is set while the socket is open.
    ``target`` returns the current ``(worker_id, headers)`` so a worker that
    re-registered gets a socket for its new id.
    """

    def __init__(
        self,
        base_url: str,
        target: Callable[[], tuple[str | None, dict[str, str]]],
        on_available: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        self.base_url = base_url
        self.target = target
        self.on_available = on_available
        self.stop = stop
        self.connected = threading.Event()
        parts = urlsplit(base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self._thread = threading.Thread(target=self._run, name="controlplane-push", daemon=True)

    def start(self) -> None:
        if AVAILABLE:
            self._thread.start()
        else:
            log.info("websockets is not installed; the worker polls for jobs.")

    def join(self, timeout: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            worker_id, headers = self.target()
            if worker_id is None:
                self.stop.wait(0.5)
                continue
            try:
                self._session(worker_id, headers)
                failures = 0
            except Exception as error:  # noqa: BLE001 - any failure means reconnect
                failures += 1
                log.debug("push socket down (%s); polling meanwhile", error)
            self.connected.clear()
            self.stop.wait(min(10.0, 0.25 * 2 ** min(failures, 6)))

    def _session(self, worker_id: str, headers: dict[str, str]) -> None:
        assert ws_connect is not None
        url = websocket_url(self.base_url, worker_id)
        with ws_connect(
            url,
            additional_headers=headers,
            origin=self.origin,
            proxy=None,  # never a proxy from the environment: the server is reached directly
            open_timeout=5,
            close_timeout=1,
        ) as ws:
            self.connected.set()
            self.on_available()  # anything enqueued while we were away
            while not self.stop.is_set():
                if self.target()[0] != worker_id:
                    return  # re-registered: reconnect for the new id
                try:
                    raw = ws.recv(timeout=0.5)
                except TimeoutError:
                    continue
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(message, dict) and message.get("type") == "job.available":
                    self.on_available()
