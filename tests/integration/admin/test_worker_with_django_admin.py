"""A worker in a host project with Django's own admin imports the admin's registrations, no more.

A project made by ``django-admin startproject`` lists ``django.contrib.admin``,
whose ``AdminConfig`` imports every app's ``admin`` module at set-up, in every
process: workers, the reaper, ``migrate``. ``django_controlplane.admin`` therefore defines
and registers its ``ModelAdmin`` classes with what that takes, and loads the
dashboard's actions, permissions, selectors and audit log (with the auth
views behind them) in the methods that show a page or run an action.

Here a host project of that kind, written from the README's recipe
(``django_controlplane.configure(globals())``) into a temporary directory,
runs the real ``runworker --burst`` in a process of its own, which reports
the modules it ended up with and what the admin registered.

The same host checks the other start-up cut that needs nothing from the host:
the cyclic collector stays off while the apps' modules and models load
(``workers.apps.WorkersConfig``), and is on again, with set-up's objects
frozen, once Django is set up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT

# What ``django-admin startproject`` writes (the parts a worker reads), with the
# database from the environment; each recipe then adds the control plane.
HOST_SETTINGS = """\
import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "host-project-test"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "hostsite.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""
RECIPES = {
    # The README's: the last lines of settings.py.
    "configure": "import django_controlplane\n\ndjango_controlplane.configure(globals())\n",
    # The apps alone, listed first (no configure(), so no app of its own listed last).
    "apps": "from django_controlplane import APPS\n\nINSTALLED_APPS = [*APPS, *INSTALLED_APPS]\n",
}

HOST_URLS = """\
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/", include("django_controlplane.urls")),
]
"""

# ``manage.py runworker --queue … --burst`` in the host, then its modules and the
# admin's registrations as one JSON line.
RUN_WORKER = """\
import json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "hostsite.settings"
from django.core.management import execute_from_command_line
try:
    execute_from_command_line(["manage.py", "runworker", "--queue", "hostadmin", "--burst"])
finally:
    from django.contrib import admin
    registered = sorted(m._meta.label for m in admin.site._registry)
    print("REPORT " + json.dumps({"modules": sorted(sys.modules), "admin": registered}), flush=True)
"""

# What a worker never uses: the admin's page-time helpers (the dashboard's
# actions, permissions, selectors, audit log; the job selectors and read
# replica routing behind them; Django's auth views), and the web stack.
NOT_IN_A_WORKER = (
    "jobs.operator_actions",
    "jobs.bulk_actions",
    "jobs.permissions",
    "dashboard.audit",
    "dashboard.db",
    "dashboard.permissions",
    "dashboard.selectors",
    "dashboard.views",
    "dashboard.urls",
    "jobs.selectors",
    "jobs.replica",
    "django_controlplane.urls",
    "django_controlplane.api",
    "django_controlplane.web",
    "django.contrib.auth.views",
    "rest_framework.views",
    "rest_framework.serializers",
    "rest_framework.renderers",
    "drf_spectacular.openapi",
    "channels.layers",
    "channels.consumer",
    "channels.routing",
    "daphne.server",
    "twisted",
)


# django.setup() in the host, reporting whether the collector ran while each model
# class was made, and its state afterwards. With "off" the process switched the
# collector off itself first, as a project's manage.py may.
SET_UP = """\
import gc, json, os, sys
os.environ["DJANGO_SETTINGS_MODULE"] = "hostsite.settings"
if sys.argv[1] == "off":
    gc.disable()
from django.db.models.signals import class_prepared
during = []
class_prepared.connect(lambda sender, **kw: during.append(gc.isenabled()), weak=False)
import django
frozen = gc.get_freeze_count()  # the interpreter's own start-up may have frozen a few
django.setup()
report = {"models": len(during), "collector_on_for": sum(during)}
report.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count() - frozen)
print("GC " + json.dumps(report), flush=True)
"""


def loaded_from(packages: tuple[str, ...], modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)]


def test_loaded_from_matches_packages_and_their_submodules() -> None:
    modules = ["jobs.selectors", "jobs.selectors.counts", "jobs.selectorsx", "dashboard.db"]
    assert loaded_from(("jobs.selectors",), modules) == ["jobs.selectors", "jobs.selectors.counts"]


def write_host(root: Path, recipe: str) -> None:
    package = root / "hostsite"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(f"{HOST_SETTINGS}\n{RECIPES[recipe]}")
    (package / "urls.py").write_text(HOST_URLS)


def run_in_host(
    root: Path, env: dict[str, str], script: str, *args: str, recipe: str = "configure"
) -> dict:
    """Run ``script`` in a fresh host project under ``root``; its one tagged JSON line."""
    write_host(root, recipe)
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    tag = script.split('print("', 1)[1].split(" ", 1)[0]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith(f"{tag} ")]
    return json.loads(line.removeprefix(f"{tag} "))


def test_a_worker_in_a_host_with_djangos_admin_loads_no_page_helpers(
    subprocess_env, tmp_path
) -> None:
    report = run_in_host(tmp_path, subprocess_env, RUN_WORKER)
    modules = report["modules"]
    assert "workers.engine" in modules  # the worker really ran in that process
    # Django's AdminConfig did discover the admin modules (this is the plain admin)…
    assert {"django_controlplane.admin", "django.contrib.auth.admin"} <= set(modules)
    assert {"controlplane.Job", "controlplane.Queue", "controlplane.Worker"} <= set(
        report["admin"]
    ), textwrap.shorten(str(report["admin"]), 300)
    # …and nothing a page or an admin action needs came with them.
    assert loaded_from(NOT_IN_A_WORKER, modules) == []


def test_the_collector_is_off_while_the_models_load_and_on_after(subprocess_env, tmp_path):
    report = run_in_host(tmp_path, subprocess_env, SET_UP, "on")
    assert report["models"] >= 20, report  # ours, auth, admin, sessions… were made
    assert report["collector_on_for"] == 0, report
    assert report["enabled"] is True, report
    assert report["frozen"] > 10_000, report  # set-up's objects, out of later collections


def test_a_process_that_switched_the_collector_off_keeps_it_off(subprocess_env, tmp_path):
    # With configure(), its last app turns the collector on whatever the process did:
    # here the apps alone, to see that WorkersConfig only undoes what it did itself.
    report = run_in_host(tmp_path, subprocess_env, SET_UP, "off", recipe="apps")
    assert report["collector_on_for"] == 0, report
    assert report["enabled"] is False and report["frozen"] == 0, report
