"""Helpers of the remote-worker tests: processes, a daphne server, small database reads."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import FAST_KNOBS, database_url_for_subprocess, wait_for

ROOT = Path(__file__).resolve().parents[3]
CLIENT_APP = Path(__file__).with_name("client_app.py")


class Proc:
    """A child process with its output in a log file, killed at teardown."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 20.0) -> str:
        wait_for(
            lambda: text in self.output() or self.popen.poll() is not None,
            timeout=timeout,
            message=f"{text!r} in the output of {self.popen.args}",
        )
        out = self.output()
        assert text in out, f"process exited ({self.popen.returncode}) before {text!r}:\n{out}"
        return out

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 20.0) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)
        self._log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(FAST_KNOBS)
    env["DATABASE_URL"] = database_url_for_subprocess()
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("CONTROLPLANE_TEST_DB_NAME", None)
    env.update(extra or {})
    return env


@dataclass
class Server:
    url: str
    proc: Proc


def start_server(log_dir: Path, extra_env: dict[str, str] | None = None) -> Server:
    port = free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "controlplane.asgi:application",
        ],
        server_env(extra_env),
        log_dir / f"daphne-{port}.log",
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.popen.poll() is None, f"daphne exited:\n{proc.output()}"
        try:
            httpx.get(url + "/workers", timeout=1)
            return True
        except httpx.TransportError:
            return False

    wait_for(answers, timeout=30, interval=0.1, message="daphne to answer")
    return Server(url, proc)


def register(
    api: httpx.Client, operations: list[Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """POST /workers for a worker of the test operations; returns the 201 body."""
    body = {"name": "t", "operations": operations or [ECHO], **extra}
    response = api.post("/workers", json=body)
    assert response.status_code == 201, response.text
    return response.json()


ECHO = {
    "name": "remote.echo",
    "queue": "remote",
    "payload_schema": {
        "type": "object",
        "required": ["text"],
        "properties": {"text": {"type": "string"}},
    },
    "max_attempts": 3,
}


def job_status(job_id: Any) -> str:
    from jobs.models import Job

    return Job.objects.values_list("status", flat=True).get(pk=job_id)


def events_of(job_id: Any) -> list[str]:
    from tests.integration.timelines import events_of as read_events

    return read_events(job_id)


def elapsed(since: float) -> float:
    return time.monotonic() - since


# A second operation of the test account, on the default queue (remote workers
# serve no local operation such as ``ping`` unless REMOTE_MAY_SERVE_LOCAL).
OTHER = {"name": "remote.other", "queue": "default", "payload_schema": {"type": "object"}}
