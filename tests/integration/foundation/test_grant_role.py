"""``manage.py grant_role``: roles are groups holding the permissions the API checks."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

pytestmark = pytest.mark.django_db


def test_viewer_sees_and_cannot_act(capsys):
    call_command("grant_role", "vera", "viewer", "--create")
    assert "vera now has the viewer role" in capsys.readouterr().out
    vera = User.objects.get(username="vera")
    assert vera.has_perm("controlplane.view_job")
    assert not vera.has_perm("controlplane.change_job")
    client = Client()
    client.force_login(vera)
    assert client.get("/jobs").status_code == 200
    assert client.post("/queues/default/pause").status_code == 403


def test_operator_may_act_and_roles_accumulate():
    User.objects.create_user("otto")
    call_command("grant_role", "otto", "operator")
    call_command("grant_role", "otto", "remote-worker")
    otto = User.objects.get(username="otto")
    assert {
        "controlplane.view_job",
        "controlplane.add_job",
        "controlplane.change_job",
        "controlplane.run_remote_jobs",
    } <= (otto.get_all_permissions())
    client = Client()
    client.force_login(otto)
    assert client.post("/queues/default/pause").status_code == 200


def test_unknown_user_is_a_clear_error():
    with pytest.raises(CommandError, match="No user named 'ghost'. Pass --create"):
        call_command("grant_role", "ghost", "viewer")
    assert not User.objects.filter(username="ghost").exists()
