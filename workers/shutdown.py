"""Two-stage shutdown (Protea's ShutdownGuard).

First SIGTERM/SIGINT: stop claiming; in-flight work gets ``SHUTDOWN_GRACE_SECONDS``
to finish. The engine then requeues whatever still runs. A second signal
exits at once with 143; leases left behind expire and the reaper requeues them.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("workers")

EXIT_GRACEFUL = 0
EXIT_GRACE_RAN_OUT = 128 + signal.SIGTERM  # 143


class ShutdownGuard:
    def __init__(self, wake: threading.Event | None = None) -> None:
        self.stopping = threading.Event()
        self.wake = wake
        self.requested_at: float | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def request(self, reason: str = "requested") -> None:
        if not self.stopping.is_set():
            self.requested_at = time.monotonic()
            log.info("worker.stopping reason=%s", reason)
            self.stopping.set()
        if self.wake is not None:
            self.wake.set()

    def grace_deadline(self, grace_seconds: float) -> float:
        return (self.requested_at or time.monotonic()) + grace_seconds

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.stopping.is_set():
            log.warning("worker.exit_now signal=%s", signal.Signals(signum).name)
            os._exit(EXIT_GRACE_RAN_OUT)
        self.request(signal.Signals(signum).name)
