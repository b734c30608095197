"""The diagnostic operations can be turned off (docs/configuration.md, "Diagnostic operations").

``ping``, ``sleep``, ``fail``, ``retry_later`` and ``fanout`` are registered at start-up
by importing ``jobs.diagnostics``. Registration is process-wide and happens once, so
each case runs in a fresh process started with its own settings (through the
``CONTROLPLANE_<NAME>`` environment variables, which win over ``settings.CONTROLPLANE``),
against this test's database, and asks the REST API what a user would: ``GET /operations``
and ``POST /jobs``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

DIAGNOSTICS = {"ping", "sleep", "fail", "retry_later", "fanout"}

# Runs in the child: Django's test client through the whole URL and middleware stack.
CHILD = """
import json, os, sys
import django
django.setup()
from django.test import Client
from jobs.operations import registry

headers = {"Authorization": "Token " + os.environ["SWITCH_TEST_TOKEN"]}
client = Client(HTTP_HOST="127.0.0.1")
listed = client.get("/operations", headers=headers)
enqueued = client.post(
    "/jobs", {"operation": "ping", "payload": {}}, content_type="application/json", headers=headers
)
print(json.dumps({
    "registered": registry.names(),
    "list_status": listed.status_code,
    "listed": [op["name"] for op in listed.json()["results"]],
    "enqueue_status": enqueued.status_code,
    "enqueue_body": enqueued.json(),
}))
"""


@pytest.fixture
def token(transactional_db) -> str:
    """An operator's token, committed so that the child process sees it."""
    from django.contrib.auth.models import Permission, User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_user("switch-operator")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_job", "add_job", "change_job"])
    )
    return Token.objects.create(user=user).key


def run_child(env: dict[str, str]) -> dict:
    argv = [sys.executable, "-c", CHILD]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_env(
    subprocess_env: dict[str, str], token: str, settings_module: str = "controlplane.settings"
) -> dict[str, str]:
    env = {**subprocess_env, "SWITCH_TEST_TOKEN": token, "DJANGO_SETTINGS_MODULE": settings_module}
    for name in ("DIAGNOSTIC_OPERATIONS", "OPERATION_MODULES"):
        env.pop(f"CONTROLPLANE_{name}", None)
    return env


def start_up(subprocess_env: dict[str, str], token: str, **knobs: str) -> dict:
    env = child_env(subprocess_env, token)
    env.update({f"CONTROLPLANE_{name}": value for name, value in knobs.items()})
    return run_child(env)


def assert_off(seen: dict) -> None:
    assert not DIAGNOSTICS & set(seen["registered"])
    assert seen["list_status"] == 200
    assert not DIAGNOSTICS & set(seen["listed"]), seen["listed"]
    assert seen["enqueue_status"] == 400, seen["enqueue_body"]
    body = seen["enqueue_body"]
    assert set(body) == {"message", "errors"}
    assert "unknown operation" in json.dumps(body).lower(), body


def test_on_by_default(subprocess_env, token):
    from jobs.conf import DEFAULTS

    assert DEFAULTS["DIAGNOSTIC_OPERATIONS"] is True
    seen = start_up(subprocess_env, token)

    assert DIAGNOSTICS <= set(seen["listed"])
    assert seen["enqueue_status"] == 201, seen["enqueue_body"]
    assert seen["enqueue_body"]["operation"] == "ping"
    assert seen["enqueue_body"]["duplicate"] is False


def test_the_switch_turns_them_off(subprocess_env, token):
    seen = start_up(subprocess_env, token, DIAGNOSTIC_OPERATIONS="false")

    assert_off(seen)
    # The rest of OPERATION_MODULES is still imported: the django.tasks backend's operation.
    assert "django.task" in seen["registered"]
    assert "django.task" in seen["listed"]


def test_the_switch_wins_over_a_module_list_that_names_them(subprocess_env, token):
    seen = start_up(
        subprocess_env,
        token,
        DIAGNOSTIC_OPERATIONS="0",
        OPERATION_MODULES="jobs.diagnostics,jobs.tasks_operation",
    )

    assert_off(seen)


def test_a_module_list_without_them_leaves_them_out_too(subprocess_env, token):
    seen = start_up(subprocess_env, token, OPERATION_MODULES="jobs.tasks_operation")

    assert_off(seen)
    assert "django.task" in seen["registered"]


def test_the_switch_in_settings(subprocess_env, token, tmp_path):
    """``CONTROLPLANE = {"DIAGNOSTIC_OPERATIONS": False}`` in a host's settings module."""
    (tmp_path / "switch_settings.py").write_text(
        "from controlplane.settings import *  # noqa: F403\n"
        'CONTROLPLANE = {**globals().get("CONTROLPLANE", {}), "DIAGNOSTIC_OPERATIONS": False}\n'
    )
    env = child_env(subprocess_env, token, settings_module="switch_settings")
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"

    assert_off(run_child(env))
