"""A worker process imports what a worker uses, so it can claim within half a second of exec.

The web stack is most of what a Django process could import: Daphne with
Twisted and Autobahn (through ``daphne.apps``), the REST framework's views
and serializers, the views of the API and the dashboard (through the URL
system checks). None of it claims or runs a job, and importing it costs more than
half a second of start-up. The real ``manage.py runworker --burst`` runs here, in a
process of its own, and reports which modules it ended up with; any of the
web stack there fails the test, whichever import brought it in. So does
payload validation's jsonschema (a fifth of what was left): operations'
schemas are checked at registration without it (``jobs.schema_precheck``);
and so do the admin's modules, discovered where the admin is used.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

# ``manage.py runworker --queue coldstart --burst``, then the loaded modules as one JSON line.
RUN_WORKER = """\
import json, os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
from django.core.management import execute_from_command_line
try:
    execute_from_command_line(["manage.py", "runworker", "--queue", "coldstart", "--burst"])
finally:
    print("MODULES " + json.dumps(sorted(sys.modules)), flush=True)
"""

# Packages and modules of the web side; a worker that imports one pays for all it drags in.
WEB_STACK = (
    "daphne.apps",
    "daphne.server",
    "twisted",
    "autobahn",
    "rest_framework.views",
    "rest_framework.serializers",
    "rest_framework.renderers",
    "drf_spectacular.openapi",
    "controlplane.urls",
    "controlplane.asgi",
    "django_controlplane.urls",
    "django_controlplane.api",
    "django_controlplane.web",
    "dashboard.urls",
    "dashboard.views",
    "prometheus_client",
)
# Loaded on demand only: payload validation (jsonschema with referencing, attrs
# and rpds; fastjsonschema), which a worker needs when an operation enqueues;
# the pages and actions behind Django's admin (django_controlplane.admin loads them
# where it shows a page).
ON_DEMAND = ("jsonschema", "referencing", "fastjsonschema", "jobs.schema_validator", "re2")
ON_DEMAND += ("jobs.operator_actions", "jobs.bulk_actions", "jobs.permissions", "jobs.selectors")
ON_DEMAND += ("dashboard.audit", "dashboard.permissions", "dashboard.db")
# django.tasks: loaded when a worker runs a django.task job (jobs.tasks_operation).
ON_DEMAND += ("django.tasks", "jobs.tasks_backend")
# OpenTelemetry: loaded once something in the process traces (jobs.tracing.api_in_use).
ON_DEMAND += ("opentelemetry", "jobs.tracing_spans")


def modules_under(packages: tuple[str, ...], modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)]


def test_modules_under_matches_packages_and_their_submodules() -> None:
    found = modules_under(
        WEB_STACK,
        ["daphne", "daphne.server", "django_controlplane.api.views", "jobs.apis", "jobs.models"],
    )
    assert found == ["daphne.server", "django_controlplane.api.views"]


def test_runworker_imports_no_web_stack(subprocess_env) -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN_WORKER],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "worker.started" in output and "worker.burst_done" in output, output
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    modules = json.loads(line.removeprefix("MODULES "))
    assert "workers.engine" in modules  # the worker really ran in that process
    assert modules_under(WEB_STACK, modules) == []
    assert modules_under(ON_DEMAND, modules) == []
