"""``runworker --processes N``: N worker processes under one supervisor (a process pool).

Each child is a full ``runworker`` process (running ``WORKER_CLASS``, the host's
``JobWorker`` subclass when set) with its own Worker row, so a
child that crashes (segfault, ``os._exit``, OOM kill) takes only itself down.
The supervisor treats its jobs as expired leases at once (requeued within the
lease budget, else failed) and starts a replacement. SIGTERM/SIGINT are
forwarded; the exit code is 143 if any child ran out of grace, else 0.

Children are forked from the supervisor, which has already imported Django,
the project and every operation module: a child serves within milliseconds
instead of the second a fresh interpreter needs, so a replacement costs the
pool almost nothing. The supervisor holds no database connection when it forks.

A child whose timed-out job ignores its cancellation (``workers.timeouts``)
still runs that job's thread after the worker gave up on it; Python cannot
kill a thread, but the supervisor can end the process. Each child publishes
when its oldest abandoned run was abandoned in a word of memory shared with
the supervisor; once that is ``TIMEOUT_KILL_GRACE_SECONDS`` old the
supervisor sends the child SIGTERM (its other jobs get the shutdown grace,
then are requeued), SIGKILL if it is still there after the grace and
clean-up, and starts a replacement as for a crash.

A stop signal is never lost on a replacement: the supervisor holds
SIGTERM/SIGINT blocked from its last look at ``stopping`` until the new child
is in ``children`` (a signal in between is delivered then, and forwarded to
it), and each child ends with its supervisor (``PR_SET_PDEATHSIG``) should the
supervisor be killed outright.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
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
from workers.timeouts import report_to

log = logging.getLogger("workers")
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
PR_SET_PDEATHSIG = 1


def _shared_double() -> ctypes.c_double:
    """A double in anonymous memory shared with the children forked after it is made."""
    return ctypes.c_double.from_buffer(mmap.mmap(-1, ctypes.sizeof(ctypes.c_double)))


@dataclass
class Child:
    args: list[str]
    worker_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    pid: int | None = None
    code: int | None = None
    # Written by the child (``workers.timeouts.report_abandoned``): when its
    # oldest abandoned run was abandoned, on CLOCK_MONOTONIC; 0.0 for none.
    abandoned_since: ctypes.c_double = field(default_factory=_shared_double)
    # When the supervisor told it to stop because of such a run (monotonic), else 0.
    stopped_at: float = 0.0

    def start(self) -> None:
        self.worker_id = str(uuid.uuid4())
        self.code = None
        self.stopped_at = 0.0
        self.abandoned_since.value = 0.0
        connections.close_all()  # a forked child must not share the supervisor's sockets
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_serve_as_child(self.args, self.worker_id, self.abandoned_since))
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


def _end_with_parent() -> None:
    """Receive SIGTERM when the supervisor dies, even by SIGKILL (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _serve_as_child(args: list[str], worker_id: str, abandoned_since: ctypes.c_double) -> int:
    """Run ``runworker`` in a freshly forked child; its exit code."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)  # the worker installs its own
    _end_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by the fork's caller
    random.seed()  # the backoff jitter must differ between siblings
    report_to(abandoned_since)
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
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for child in self.children:
                child.start()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        codes: dict[int, int] = {}
        while True:
            running = 0
            for index, child in enumerate(self.children):
                code = child.poll()
                if code is None:
                    running += 1
                    self._stop_if_stuck(child)
                    continue
                if index in codes:
                    continue
                stuck = child.stopped_at > 0
                if self.stopping or (self.burst and code == EXIT_GRACEFUL and not stuck):
                    codes[index] = code
                    continue
                self._recover(child, code)
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                try:
                    if self.stopping:  # a stop arrived during the recovery: no replacement
                        codes[index] = code
                        continue
                    child.start()
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
                running += 1
            if running == 0:
                break
            time.sleep(0.1)
        return (
            EXIT_GRACE_RAN_OUT
            if any(c == EXIT_GRACE_RAN_OUT for c in codes.values())
            else EXIT_GRACEFUL
        )

    def _stop_if_stuck(self, child: Child) -> None:
        """SIGTERM a child whose abandoned timed-out run outlived ``TIMEOUT_KILL_GRACE_SECONDS``;
        SIGKILL it if it is still there after its shutdown grace and clean-up."""
        if self.stopping:
            return  # every child is stopping already
        now = time.monotonic()
        if child.stopped_at:
            if now - child.stopped_at > self._stop_budget():
                log.error("worker.child_killed id=%s (did not stop after SIGTERM)", child.worker_id)
                child.signal(signal.SIGKILL)
                child.stopped_at = math.inf  # once
            return
        since = child.abandoned_since.value
        if since and now - since > float(knob("TIMEOUT_KILL_GRACE_SECONDS")):
            log.warning(
                "worker.child_stopped id=%s pid=%s reason=timeout (a timed-out job's thread "
                "ran %.1fs past its timeout and ignored it); starting a replacement",
                child.worker_id,
                child.pid,
                now - since,
            )
            child.stopped_at = now
            child.signal(signal.SIGTERM)

    def _stop_budget(self) -> float:
        """Seconds a child may take to stop after SIGTERM: its grace, its clean-up, a margin."""
        grace = float(knob("SHUTDOWN_GRACE_SECONDS"))
        args = self.children[0].args if self.children else []
        if "--shutdown-grace-seconds" in args:
            grace = float(args[args.index("--shutdown-grace-seconds") + 1])
        return grace + float(knob("SHUTDOWN_CLEANUP_SECONDS")) + 5.0

    def _recover(self, child: Child, code: int) -> None:
        """A child died on its own, or was stopped for a stuck run: its jobs follow the
        expired-lease rules now (none are left after a clean stop)."""
        requeued, failed = requeue_expired_leases(
            max_requeues=int(knob("MAX_LEASE_REQUEUES")), worker_ids=[uuid.UUID(child.worker_id)]
        )
        Worker.objects.filter(pk=child.worker_id).delete()
        if child.stopped_at:
            log.warning(
                "worker.child_restarted exit=%s requeued=%d failed=%d reason=timeout",
                code,
                len(requeued),
                len(failed),
            )
            return
        log.error(
            "worker.child_died exit=%s requeued=%d failed=%d; starting a replacement",
            code,
            len(requeued),
            len(failed),
        )
