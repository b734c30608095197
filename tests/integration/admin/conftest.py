"""Fixtures for the admin tests: a logged-in staff client per role.

Staff accounts, since the admin lets in staff only; their roles are the
dashboard's permissions, looked up through the Job model so the app label
is never spelled out.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from jobs.models import Job
from jobs.permissions import ACT_PERM, VIEW_PERM


def staff_user(role: str) -> User:
    """``admin`` (superuser), ``operator`` (view + change jobs) or ``viewer`` (view jobs)."""
    name = f"{role}-{uuid.uuid4().hex[:6]}"
    if role == "admin":
        return User.objects.create_superuser(name, f"{name}@example.com", None)
    user = User.objects.create_user(name, f"{name}@example.com", None, is_staff=True)
    perms = {"operator": [VIEW_PERM, ACT_PERM], "viewer": [VIEW_PERM]}[role]
    job_type = ContentType.objects.get_for_model(Job)
    codenames = [perm.split(".", 1)[1] for perm in perms]
    user.user_permissions.add(
        *Permission.objects.filter(content_type=job_type, codename__in=codenames)
    )
    return user


def _client(role: str) -> Client:
    client = Client()
    client.force_login(staff_user(role))
    return client


@pytest.fixture
def superuser_client(db) -> Client:
    return _client("admin")


@pytest.fixture
def operator_client(db) -> Client:
    return _client("operator")


@pytest.fixture
def viewer_client(db) -> Client:
    return _client("viewer")
