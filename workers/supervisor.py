"""``runworker --processes N``: N worker processes under one supervisor (horsies' process model).

Each child is a full ``runworker`` process with its own Worker row, so a
child that crashes (segfault, ``os._exit``, OOM kill) takes only itself down.
The supervisor treats its jobs as expired leases at once (requeued within the
lease budget, else failed) and starts a replacement. SIGTERM/SIGINT are
forwarded; the exit code is 143 if any child ran out of grace, else 0.

Children are forked from the supervisor, which has already imported Django,
the project and every operation module: a child serves within milliseconds
instead of the second a fresh interpreter needs, so a replacement costs the
pool almost nothing. The supervisor holds no database connection when it forks.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field

from django.core.management import call_command
from django.db import connections

from jobs.conf import knob
from jobs.models import Worker
from jobs.rescues import requeue_expired_leases
from workers.shutdown import EXIT_GRACE_RAN_OUT, EXIT_GRACEFUL

log = logging.getLogger("workers")


@dataclass
class Child:
    args: list[str]
    worker_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    pid: int | None = None
    code: int | None = None

    def start(self) -> None:
        self.worker_id = str(uuid.uuid4())
        self.code = None
        connections.close_all()  # a forked child must not share the supervisor's sockets
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_serve_as_child(self.args, self.worker_id))
        self.pid = pid

    def poll(self) -> int | None:
        """The child's exit code once it has ended (negative: the signal that ended it)."""
        if self.pid is not None and self.code is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def signal(self, signum: int) -> None:
        if self.pid is not None and self.poll() is None:
            os.kill(self.pid, signum)


def _serve_as_child(args: list[str], worker_id: str) -> int:
    """Run ``runworker`` in a freshly forked child; its exit code."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)  # the worker installs its own
    random.seed()  # the backoff jitter must differ between siblings
    code = 1
    try:
        call_command("runworker", *args, "--worker-id", worker_id)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - report, then leave without the supervisor's cleanup
        log.exception("worker.child_failed id=%s", worker_id)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


class Supervisor:
    def __init__(self, child_args: list[str], processes: int, *, burst: bool = False) -> None:
        self.children = [Child(list(child_args)) for _ in range(processes)]
        self.burst = burst
        self.stopping = False

    def _forward(self, signum: int, frame: object) -> None:
        self.stopping = True
        for child in self.children:
            child.signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for child in self.children:
            child.start()
        codes: dict[int, int] = {}
        while True:
            running = 0
            for index, child in enumerate(self.children):
                code = child.poll()
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
