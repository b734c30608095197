"""The heartbeat: one thread per worker process that keeps its leases alive.

Every ``HEARTBEAT_SECONDS`` it extends the leases of all jobs the process
holds (one UPDATE) and refreshes the worker's ``last_heartbeat``. A job whose
lease could not be extended was cancelled or taken over: its cancel event is
set so the operation stops and the worker writes nothing over it. If the
heartbeat itself dies, leases simply expire and the reaper takes over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from workers.resilience import reset_connection

log = logging.getLogger("workers")


class HeartbeatLoop:
    def __init__(self, beat: Callable[[], None], *, interval_seconds: float) -> None:
        self._beat = beat
        self.interval_seconds = interval_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop beating; wait at most ``timeout`` for a beat in progress."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self._beat()
            except Exception as error:  # noqa: BLE001 - keep beating; leases cover the gap
                log.warning("heartbeat.failed error=%s", error)
                reset_connection()
        connections.close_all()
