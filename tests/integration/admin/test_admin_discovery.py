"""The admin's modules load where the admin is used, and its checks still cover them.

``controlplane.apps.AdminConfig`` leaves Django's discovery of ``admin``
modules out of set-up (a worker never shows a page); the URLconf and the
admin's system checks discover them. A fresh process shows both halves:
set-up alone leaves ``jobs.admin`` unloaded, and ``manage.py check --tag
admin`` (the URL check, which would load the URLconf, not run) loads it and
checks the ``ModelAdmin`` classes it registers.
"""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CHECK_ADMIN = """\
import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
import django
django.setup()
print("after set-up:", "jobs.admin" in sys.modules)
from unittest import mock
from django.contrib.admin import ModelAdmin
from django.core.checks import Error
from django.core.management import call_command
with mock.patch.object(ModelAdmin, "check", lambda self, **kw: [Error("seen", obj=self)]):
    try:
        call_command("check", tags=["admin"])
    except Exception as error:
        print("check:", type(error).__name__, str(error).count("seen"))
print("after check:", "jobs.admin" in sys.modules)
"""


def test_set_up_leaves_the_admin_undiscovered_and_its_checks_discover_it(subprocess_env):
    done = subprocess.run(
        [sys.executable, "-c", CHECK_ADMIN],
        cwd=ROOT,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert "after set-up: False" in done.stdout, output
    assert "after check: True" in done.stdout, output
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("check:")]
    kind, seen = line.removeprefix("check: ").split()
    assert kind == "SystemCheckError" and int(seen) >= 5, output  # jobs' ModelAdmins among them


def test_the_urlconf_discovers_the_admin(client):
    from django.contrib import admin

    from jobs.models import Job

    assert client.get("/admin/login/").status_code == 200
    assert admin.site.is_registered(Job)
