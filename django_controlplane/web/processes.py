"""The web tier's processes: one listening socket each, on the same port (``SO_REUSEPORT``).

Why not uvicorn's ``--workers``: its processes share one listening socket and
take turns accepting from it, and the turns are far from fair. Measured with
32 keep-alive clients on two processes: 25 connections landed on one process
and 7 on the other, so one queued for its threads while the other idled.
With ``SO_REUSEPORT`` each process has a socket of its own and the kernel
spreads new connections over them by a hash of each connection's addresses.

The supervisor (``manage.py serve``) binds the sockets and keeps them: a
process that dies is restarted on the same socket, and connections the
kernel hashed to it wait in its backlog meanwhile instead of being refused.
Each server process is ``python -m django_controlplane.web.processes --fd N`` (uvicorn's
``Server`` on that socket); it ends with its supervisor (``PR_SET_PDEATHSIG``).

Limits each server applies to its clients (knobs read by the supervisor, passed
on the command line): a request head must arrive within
``HTTP_HEADER_TIMEOUT_SECONDS`` (``django_controlplane.web.head_timeout``), an idle keep-alive
connection is closed after ``HTTP_KEEP_ALIVE_SECONDS``, and a WebSocket message
larger than ``MAX_WEBSOCKET_MESSAGE_BYTES`` closes its socket (1009).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUPERVISED = "CONTROLPLANE_WEB_SUPERVISED"  # set in the environment of each server process
BACKLOG = 2048


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` that other sockets may share (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


@dataclass(frozen=True)
class ClientLimits:
    """What one server process allows a client (see the module's docstring)."""

    header_timeout: float = 10.0
    keep_alive: float = 5.0
    ws_max_size: int = 64 * 1024

    @classmethod
    def from_knobs(cls) -> ClientLimits:
        from jobs.conf import knob

        return cls(
            header_timeout=float(knob("HTTP_HEADER_TIMEOUT_SECONDS")),
            keep_alive=float(knob("HTTP_KEEP_ALIVE_SECONDS")),
            ws_max_size=int(knob("MAX_WEBSOCKET_MESSAGE_BYTES")),
        )

    def argv(self) -> list[str]:
        return [
            "--header-timeout",
            str(self.header_timeout),
            "--keep-alive",
            str(self.keep_alive),
            "--ws-max-size",
            str(self.ws_max_size),
        ]


@dataclass
class ServerProcess:
    sock: socket.socket
    argv: list[str]
    env: dict[str, str]
    cwd: str
    popen: subprocess.Popen | None = field(default=None)

    def start(self) -> None:
        fd = self.sock.fileno()
        self.popen = subprocess.Popen(
            [*self.argv, "--fd", str(fd)], env=self.env, cwd=self.cwd, pass_fds=(fd,)
        )


class WebSupervisor:
    """Starts ``processes`` server processes, restarts one that dies, stops them all on a signal."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        processes: int,
        app: str,
        env: dict[str, str],
        log_level: str = "warning",
        cwd: str | None = None,
        limits: ClientLimits | None = None,
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "django_controlplane.web.processes",
            "--app",
            app,
            "--log-level",
            log_level,
        ]
        argv += (limits or ClientLimits()).argv()
        env = {**env, SUPERVISED: "1"}
        workdir = cwd or os.getcwd()
        self.children = [
            ServerProcess(reuse_port_socket(host, port), argv, env, workdir)
            for _ in range(processes)
        ]
        self.stopping = False

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True
        for child in self.children:
            if child.popen is not None and child.popen.poll() is None:
                child.popen.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for child in self.children:
            child.start()
        while True:
            running = 0
            for child in self.children:
                if child.popen is None:
                    continue
                code = child.popen.poll()
                if code is None:
                    running += 1
                elif not self.stopping:
                    print(f"web process {child.popen.pid} exited {code}; restarting it", flush=True)
                    child.start()
                    running += 1
            if running == 0:
                return 0
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    """One server process: uvicorn's ``Server`` on the inherited socket ``--fd``."""
    parser = argparse.ArgumentParser(prog="python -m django_controlplane.web.processes")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--log-level", default="warning")
    defaults = ClientLimits()
    parser.add_argument("--header-timeout", type=float, default=defaults.header_timeout)
    parser.add_argument("--keep-alive", type=float, default=defaults.keep_alive)
    parser.add_argument("--ws-max-size", type=int, default=defaults.ws_max_size)
    options = parser.parse_args(argv)
    sys.path.insert(0, str(Path.cwd()))
    import uvicorn

    from django_controlplane.web.head_timeout import head_timeout_protocol

    config = uvicorn.Config(
        options.app,
        lifespan="on",
        access_log=False,
        log_level=options.log_level,
        timeout_graceful_shutdown=10,
        http=head_timeout_protocol(options.header_timeout),
        timeout_keep_alive=options.keep_alive,  # typed int, used as a float (call_later)
        ws_max_size=options.ws_max_size,
    )
    sock = socket.socket(fileno=options.fd)  # family and type read from the socket itself
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
