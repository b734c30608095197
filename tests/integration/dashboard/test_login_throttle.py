"""Password guessing on the dashboard's sign-in page meets a lockout."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache(settings):
    settings.CONTROLPLANE = {**(settings.CONTROLPLANE or {}), "LOGIN_MAX_FAILURES": 3}
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    cache.clear()
    yield
    cache.clear()


def _sign_in(client: Client, username: str, password: str):
    return client.post(reverse("dashboard:login"), {"username": username, "password": password})


def test_failed_sign_ins_lock_the_name_out_even_with_the_right_password() -> None:
    User.objects.create_user("alice", password="right-password")
    client = Client()
    for _ in range(3):
        assert _sign_in(client, "alice", "wrong").status_code == 200
    locked = _sign_in(client, "alice", "right-password")
    assert locked.status_code == 429
    assert b"Too many failed sign-ins" in locked.content
    assert "_auth_user_id" not in client.session
    # Another user name from the same address is not locked out.
    User.objects.create_user("bob", password="bobs-password")
    assert _sign_in(Client(), "bob", "bobs-password").status_code == 302


def test_a_success_clears_the_count() -> None:
    User.objects.create_user("carol", password="right-password")
    client = Client()
    for _ in range(2):
        _sign_in(client, "carol", "wrong")
    assert _sign_in(client, "carol", "right-password").status_code == 302
    other = Client()
    for _ in range(2):
        assert _sign_in(other, "carol", "wrong").status_code == 200
    assert _sign_in(other, "carol", "right-password").status_code == 302
