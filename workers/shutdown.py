"""Two-stage shutdown (finish what runs, then requeue it), with a bound on the whole of it.

First SIGTERM/SIGINT: stop claiming; in-flight work gets ``SHUTDOWN_GRACE_SECONDS``
to finish. Then the engine requeues whatever still runs (``job.requeued``),
removes its Worker row and exits 143 (0 when nothing was cut short).

A second SIGTERM/SIGINT during the grace ends the grace at once: the same
requeue and clean-up follow straight away. Not an immediate ``os._exit``: that
would leave the jobs ``running`` until their leases expire (and for ever
without a reaper) and the Worker row behind, which is worse than the fraction
of a second the clean-up takes. Not ignored either: systemd and Kubernetes
send SIGTERM once and SIGKILL later, so a second signal comes from a person
(Ctrl-C twice) or a script that wants the worker gone now, not after the
grace. Later signals are logged and change nothing.

A signal that arrives within ``REPEAT_SECONDS`` of the first is the same
request delivered twice, not a second one: systemd's default
``KillMode=control-group`` signals every process of the unit, and
``runworker --processes`` forwards its own signal to children that already
got it (a terminal's Ctrl-C reaches the whole foreground process group too).
Without this, every child of a supervised worker would skip its grace.

Whatever happens to the database meanwhile (a lock held on a job row, a
server that stopped answering), the process is gone by
``min(first signal + grace, second signal) + SHUTDOWN_CLEANUP_SECONDS``: a
watchdog thread, armed by the first signal, exits with 143 if the clean-up
is still running then. Jobs it could not requeue keep their leases, which
expire; the reaper requeues them (``job.lease_expired_requeue``).

Signals are acted on by a thread of their own, woken through
``signal.set_wakeup_fd``, not in a Python handler on the main thread: such a
handler waits until the main thread is back in Python code (it may be in a
long C call, such as SQLite waiting out a lock), and it could deadlock on a
lock the main thread holds at that instant (an ``Event``'s, the logging
handler's).
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

# A signal this soon after the first is the first one delivered again.
REPEAT_SECONDS = 1.0


class ShutdownGuard:
    """Shutdown state shared by the signal thread, the main loop and the watchdog.

    ``stopping`` is set by the first signal (stop claiming), ``hurry`` by the
    second (skip the rest of the grace). The watchdog only runs in a process
    the guard owns (``install()`` was called): a worker run in-process by a
    test or an embedding program is never exited from under its host.
    """

    def __init__(
        self,
        wake: threading.Event | None = None,
        *,
        grace_seconds: float = 30.0,
        cleanup_seconds: float = 5.0,
    ) -> None:
        self.stopping = threading.Event()
        self.hurry = threading.Event()
        self.wake = wake
        self.grace_seconds = grace_seconds
        self.cleanup_seconds = cleanup_seconds
        self.requested_at: float | None = None
        self.hurried_at: float | None = None
        self._owns_process = False
        self._done = threading.Event()
        self._changed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def install(self) -> None:
        """Take over SIGTERM and SIGINT for this process (call from the main thread)."""
        self._owns_process = True
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        # The interpreter's C-level handler writes each signal's number to the
        # pipe as it arrives, whatever the main thread is doing; the Python-level
        # handler (needed for that) has nothing left to do.
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _noted_by_the_signal_thread)
        threading.Thread(
            target=self._read_signals, args=(read_fd,), name="signals", daemon=True
        ).start()

    def _read_signals(self, read_fd: int) -> None:
        while True:
            try:
                received = os.read(read_fd, 64)
            except InterruptedError:
                continue
            if not received:
                return
            for signum in received:
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self._on_signal(signum)

    def request(self, reason: str = "requested") -> None:
        """Stage one: stop claiming; in-flight work has the grace to finish."""
        if not self.stopping.is_set():
            self.requested_at = time.monotonic()
            log.info(
                "worker.stopping reason=%s grace=%gs (a second signal skips the rest of it)",
                reason,
                self.grace_seconds,
            )
            self.stopping.set()
            self._arm()
        if self.wake is not None:
            self.wake.set()

    def hurry_up(self, reason: str = "requested") -> None:
        """Stage two now: end the grace; in-flight jobs are requeued at once."""
        if not self.stopping.is_set():
            self.request(reason)
        if not self.hurry.is_set():
            # ``hurry`` before ``hurried_at``: the drain ends as soon as the deadline
            # moves, and must then already see why (the requeue's reason reads it).
            self.hurry.set()
            self.hurried_at = time.monotonic()
            log.warning(
                "worker.grace_skipped reason=%s: requeueing in-flight jobs and exiting", reason
            )
            self._changed.set()
        else:
            log.warning("worker.already_exiting reason=%s", reason)
        if self.wake is not None:
            self.wake.set()

    def grace_deadline(self) -> float:
        """When in-flight work stops being waited for (monotonic clock)."""
        deadline = (self.requested_at or time.monotonic()) + self.grace_seconds
        if self.hurried_at is not None:
            deadline = min(deadline, self.hurried_at)
        return deadline

    def exit_deadline(self) -> float:
        """When the process is gone at the latest, whatever the clean-up is waiting for."""
        return self.grace_deadline() + self.cleanup_seconds

    def done(self) -> None:
        """The worker finished its clean-up: the watchdog stands down."""
        self._done.set()
        self._changed.set()

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.stopping.is_set():
            self.request(name)
        elif time.monotonic() - (self.requested_at or 0.0) < REPEAT_SECONDS:
            log.info(
                "worker.signal_repeated signal=%s: within %gs of the first, the same request",
                name,
                REPEAT_SECONDS,
            )
        else:
            self.hurry_up(name)

    def _arm(self) -> None:
        if not self._owns_process or self._watchdog is not None:
            return
        self._watchdog = threading.Thread(target=self._watch, name="shutdown-watchdog", daemon=True)
        self._watchdog.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            remaining = self.exit_deadline() - time.monotonic()
            if remaining <= 0:
                break
            self._changed.wait(remaining)
            self._changed.clear()
        if self._done.is_set():
            return
        log.error(
            "worker.exit_forced after=%.1fs: the clean-up did not finish within %gs; "
            "jobs not requeued keep their leases, which expire (the reaper requeues them)",
            time.monotonic() - (self.requested_at or time.monotonic()),
            self.cleanup_seconds,
        )
        for handler in logging.getLogger().handlers + log.handlers:
            try:
                handler.flush()
            except Exception:  # noqa: BLE001 - exiting regardless
                pass
        os._exit(EXIT_GRACE_RAN_OUT)


def _noted_by_the_signal_thread(signum: int, frame: object) -> None:
    """Installed so the interpreter writes the signal to the wakeup pipe; no work here."""
