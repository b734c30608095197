"""``manage.py serve``: the production web setup, one process per core behind one port.

Each process serves everything (REST API, dashboard, static files, WebSockets)
through ``settings.ASGI_APPLICATION`` under uvicorn, with at most
``WEB_THREADS`` threads for synchronous views and ``WEB_DB_POOL_SIZE``
pooled database connections (plus one LISTEN connection for live updates).
This command stays as their supervisor: each process listens on a socket of
its own on the same port (``SO_REUSEPORT``: the kernel spreads connections
evenly), and one that dies is restarted (``django_controlplane.web.processes``). Static files
are collected first, so they are served under hashed names, compressed, with
far-future cache headers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from django_controlplane.web.processes import ClientLimits, WebSupervisor


def _asgi_path() -> str:
    """``settings.ASGI_APPLICATION`` (``pkg.module.attr``) as uvicorn's ``pkg.module:attr``."""
    module, _, attribute = settings.ASGI_APPLICATION.rpartition(".")
    return f"{module}:{attribute}"


class Command(BaseCommand):
    help = "Serve the API, dashboard, static files and WebSockets: N processes behind one port."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", 8000)))
        parser.add_argument(
            "--processes",
            type=int,
            default=int(os.environ.get("CONTROLPLANE_WEB_PROCESSES") or os.cpu_count() or 1),
            help="Server processes (default: one per core).",
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="Threads per process for synchronous views (default WEB_THREADS, 2).",
        )
        parser.add_argument(
            "--no-collectstatic",
            action="store_true",
            help="Serve static files as already collected (or from the apps' folders).",
        )
        parser.add_argument("--log-level", default="warning")

    def handle(self, *args, **options):
        if options["processes"] < 1:
            raise CommandError("--processes must be at least 1.")
        env = dict(os.environ)
        if options["threads"] is not None:
            if options["threads"] < 1:
                raise CommandError("--threads must be at least 1.")
            env["CONTROLPLANE_WEB_THREADS"] = str(options["threads"])
        if not options["no_collectstatic"]:
            self._collectstatic()
            env["CONTROLPLANE_STATIC_MANIFEST"] = "1"
        self.stdout.write(
            f"Serving on http://{options['host']}:{options['port']} with "
            f"{options['processes']} process(es)."
        )
        self.stdout.flush()
        # New interpreters, not forks of this one: they load the settings afresh
        # (the static storage is chosen at load, and this process chose the plain one).
        supervisor = WebSupervisor(
            host=options["host"],
            port=options["port"],
            processes=options["processes"],
            app=_asgi_path(),
            env=env,
            log_level=options["log_level"],
            cwd=str(Path(sys.path[0] or os.getcwd()).resolve()),
            limits=ClientLimits.from_knobs(),
        )
        sys.exit(supervisor.run())

    @staticmethod
    def _collectstatic() -> None:
        # In a fresh process: the storage (hashed, compressed names) is chosen
        # when the settings load, and this one loaded them with the plain one.
        env = {**os.environ, "CONTROLPLANE_STATIC_MANIFEST": "1"}
        command = [sys.executable, "-m", "django", "collectstatic", "--noinput", "-v0"]
        if subprocess.run(command, env=env, check=False).returncode != 0:
            raise CommandError("collectstatic failed; see its output above.")
