"""A stranger's Django project with the built wheel installed: how the packaging tests get one.

Everything here runs the way a user would: the wheel is built from a copy of
the checkout with ``python -m build``, installed (not editable) into a fresh
virtualenv, and ``django-admin startproject`` / ``startapp`` make the host
project, which is then edited with the lines README.md ("Adding it to your
Django project") prints. Subprocesses get an environment without this
checkout on ``PYTHONPATH``, so what runs is the host's code and the installed
wheel, never /work/main.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import FAST_KNOBS

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
README_SECTION = "## Adding it to your Django project"

# Variables of the test run that must not reach the host project's processes:
# they point at this checkout, its settings or its test database.
FOREIGN_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DATABASE_URL", "PYTHONSTARTUP")


def run(
    args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> str:
    """Run a command to completion; a non-zero exit fails with everything it printed."""
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, args))} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return done.stdout


# --- the wheel -------------------------------------------------------------------------


def copy_checkout(dest: Path) -> Path:
    """The files git would commit (tracked or new, not ignored), copied to ``dest``.

    Building from a copy keeps ``build/`` and ``*.egg-info`` out of the
    checkout, and leaves out what is only local (``.venv``, databases).
    """
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is not there
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def build_wheel(workdir: Path) -> Path:
    """``python -m build --wheel`` over a copy of the checkout; the path of the one wheel."""
    source = copy_checkout(workdir / "src")
    out = workdir / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)], cwd=source)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


# --- the virtualenv --------------------------------------------------------------------


@dataclass(frozen=True)
class Venv:
    path: Path

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def site_packages(self) -> Path:
        (found,) = self.path.glob("lib/python3*/site-packages")
        return found

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment minus the checkout's traces, with the venv first on PATH."""
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
        env = {k: v for k, v in env.items() if not k.startswith(("DJANGO_", "CONTROLPLANE_"))}
        env.update(FAST_KNOBS)
        env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env


def make_venv(path: Path, wheel: Path) -> Venv:
    """A fresh virtualenv of this interpreter with ``pip install <wheel>`` (not editable)."""
    run([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    venv = Venv(path)
    run(
        [venv.python, "-m", "pip", "install", "--quiet", str(wheel)],
        cwd=path.parent,
        env=venv.env(),
        timeout=300,
    )
    return venv


# --- README.md -------------------------------------------------------------------------


def readme_section() -> str:
    """README.md's "Adding it to your Django project" section, heading to next heading."""
    text = README.read_text()
    start = text.index(README_SECTION)
    end = text.find("\n## ", start + len(README_SECTION))
    return text[start : end if end != -1 else None]


def readme_blocks(language: str) -> list[str]:
    """The fenced blocks of that section in ``language`` (``python``, ``sh``)."""
    return re.findall(rf"```{language}\n(.*?)```", readme_section(), flags=re.DOTALL)


def readme_block(marker: str, language: str = "python") -> str:
    """The one README block of that section that contains ``marker``."""
    found = [block for block in readme_blocks(language) if marker in block]
    assert len(found) == 1, f"README.md ({README_SECTION!r}): one block with {marker!r}: {found}"
    return found[0]


def readme_commands() -> list[list[str]]:
    """The ``python manage.py …`` lines of the section's run block, as argument lists."""
    block = readme_block("manage.py migrate", "sh")
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    return [shlex.split(line)[2:] for line in lines if line.startswith("python manage.py ")]


def replace_once(text: str, old: str, new: str, where: str) -> str:
    assert text.count(old) == 1, f"{where}: expected {old!r} once (startproject changed?)"
    return text.replace(old, new)


# --- the host project ------------------------------------------------------------------


@dataclass
class HostProject:
    """``mysite`` + ``billing`` in ``root``, run with ``venv``'s interpreter."""

    root: Path
    venv: Venv

    def env(self, **extra: str) -> dict[str, str]:
        return self.venv.env(**{"DJANGO_SETTINGS_MODULE": "mysite.settings", **extra})

    def manage(self, *args: str, timeout: float = 60, **env: str) -> str:
        return run(
            [self.venv.python, "manage.py", *args],
            cwd=self.root,
            env=self.env(**env),
            timeout=timeout,
        )

    def shell_json(self, code: str, **env: str) -> Any:
        """Run ``code`` in ``manage.py shell -c``; it prints one JSON document, returned here."""
        out = self.manage("shell", "--verbosity", "0", "--no-imports", "-c", code, **env)
        return json.loads(out.strip().splitlines()[-1])

    def write(self, name: str, text: str) -> None:
        (self.root / name).write_text(text)

    def edit(self, name: str, old: str, new: str) -> None:
        path = self.root / name
        path.write_text(replace_once(path.read_text(), old, new, name))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Background:
    """A long-running command of the host project (server, worker, reaper), its output in a file."""

    def __init__(self, project: HostProject, args: list[str], log: Path, **env: str) -> None:
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")
        self.popen = subprocess.Popen(
            [project.venv.python, *args],
            cwd=project.root,
            env=project.env(**env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.args} exited {self.popen.returncode}:\n{self.output()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.args} printed no {text!r} in {timeout} s")
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL past ``timeout``; the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()
        return self.popen.returncode


class Server(Background):
    """A web server of the host project on a free port: ``manage.py serve`` or another."""

    def __init__(self, project: HostProject, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(project, [a.replace("{port}", str(self.port)) for a in args], log)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the server answers HTTP at all (bounded); fails early if it exited."""
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.args} exited {self.popen.returncode}:\n{self.output()}"
                )
            try:
                httpx.get(f"{self.url}/ops/", timeout=2)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{self.args} did not answer in {timeout} s:\n{self.output()}"
                    ) from None
                time.sleep(0.1)


# --- making it: startproject, README's lines, the billing app -------------------------

BILLING_MODELS = """\
from django.db import models


class Invoice(models.Model):
    number = models.CharField(max_length=20, unique=True)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    paid = models.BooleanField(default=False)
"""

BILLING_OPERATIONS = '''\
from jobs.operations import operation

from billing.models import Invoice


@operation(
    "billing.mark_paid",
    queue="default",
    payload_schema={
        "type": "object",
        "required": ["invoice"],
        "properties": {"invoice": {"type": "integer"}},
    },
)
def mark_paid(ctx, payload):
    """Mark one invoice paid."""
    invoice = Invoice.objects.get(pk=payload["invoice"])
    invoice.paid = True
    invoice.save(update_fields=["paid"])
    ctx.emit("billing.paid", f"invoice {invoice.number} paid", number=invoice.number)
    return {"number": invoice.number, "total": str(invoice.total)}
'''

# The host's own DRF defaults, chosen so that a leak into our API shows: no
# authentication at all and only the browsable (HTML) renderer.
HOST_REST_FRAMEWORK = {
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_AUTHENTICATION_CLASSES": [],
}


def apply_readme(project: HostProject) -> None:
    """Edit ``mysite`` exactly as README.md's "Adding it to your Django project" says."""
    assert "pip install /path/to/checkout" in readme_block("pip install", "sh")
    settings_block = readme_block("configure(globals())")
    settings = project.root / "mysite" / "settings.py"
    settings.write_text(f"{settings.read_text()}\n{settings_block}")
    project.write("mysite/urls.py", readme_block('include("django_controlplane.urls")'))
    asgi = readme_block("django_controlplane.asgi")
    assert 'setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")' in asgi, asgi
    project.write("mysite/asgi.py", asgi)


def add_billing(project: HostProject, database: dict[str, str] | None) -> None:
    """The host's own app, its DRF defaults and (for PostgreSQL) its database."""
    project.write("billing/models.py", BILLING_MODELS)
    project.write("billing/operations.py", BILLING_OPERATIONS)
    last_app = "    'django.contrib.staticfiles',\n]"
    project.edit(
        "mysite/settings.py", last_app, "    'django.contrib.staticfiles',\n    'billing',\n]"
    )
    extra = f"\nREST_FRAMEWORK = {HOST_REST_FRAMEWORK!r}\n"
    if database is not None:
        extra += f"\nDATABASES = {{'default': {database!r}}}\n"
    settings = project.root / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + extra)


def start_project(root: Path, venv: Venv, database: dict[str, str] | None) -> HostProject:
    """``startproject mysite .`` + ``startapp billing``, edited as README.md says.

    The host's own settings (its app, its DRF defaults, its database) go in
    first; the README's lines come last, as it says.
    """
    root.mkdir()
    django_admin = str(venv.path / "bin" / "django-admin")
    run([django_admin, "startproject", "mysite", "."], cwd=root, env=venv.env())
    project = HostProject(root, venv)
    project.manage("startapp", "billing")
    add_billing(project, database)
    apply_readme(project)
    return project
