"""``runworker --processes N``: N worker processes under one supervisor (horsies' process model).

Each child is a full ``runworker`` process with its own Worker row, so a
child that crashes (segfault, ``os._exit``, OOM kill) takes only itself down.
The supervisor treats its jobs as expired leases at once (requeued within the
lease budget, else failed) and starts a replacement. SIGTERM/SIGINT are
forwarded; the exit code is 143 if any child ran out of grace, else 0.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from jobs.conf import knob
from jobs.models import Worker
from jobs.rescues import requeue_expired_leases
from workers.shutdown import EXIT_GRACE_RAN_OUT, EXIT_GRACEFUL

log = logging.getLogger("workers")
MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


@dataclass
class Child:
    args: list[str]
    worker_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.worker_id = str(uuid.uuid4())
        self.popen = subprocess.Popen(
            [sys.executable, str(MANAGE), "runworker", *self.args, "--worker-id", self.worker_id]
        )


class Supervisor:
    def __init__(self, child_args: list[str], processes: int, *, burst: bool = False) -> None:
        self.children = [Child(list(child_args)) for _ in range(processes)]
        self.burst = burst
        self.stopping = False

    def _forward(self, signum: int, frame: object) -> None:
        self.stopping = True
        for child in self.children:
            if child.popen and child.popen.poll() is None:
                child.popen.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for child in self.children:
            child.start()
        codes: dict[int, int] = {}
        while True:
            running = 0
            for index, child in enumerate(self.children):
                code = child.popen.poll() if child.popen else 0
                if code is None:
                    running += 1
                    continue
                if index in codes:
                    continue
                if self.stopping or (self.burst and code == EXIT_GRACEFUL):
                    codes[index] = code
                    continue
                self._recover(child, code)
                child.start()
                running += 1
            if running == 0:
                break
            time.sleep(0.1)
        return (
            EXIT_GRACE_RAN_OUT
            if any(c == EXIT_GRACE_RAN_OUT for c in codes.values())
            else EXIT_GRACEFUL
        )

    def _recover(self, child: Child, code: int) -> None:
        """A child died on its own: its jobs follow the expired-lease rules now."""
        requeued, failed = requeue_expired_leases(
            max_requeues=int(knob("MAX_LEASE_REQUEUES")), worker_ids=[uuid.UUID(child.worker_id)]
        )
        Worker.objects.filter(pk=child.worker_id).delete()
        log.error(
            "worker.child_died exit=%s requeued=%d failed=%d; starting a replacement",
            code,
            len(requeued),
            len(failed),
        )
