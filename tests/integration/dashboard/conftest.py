"""Fixtures for the dashboard's integration tests: a logged-in client per role."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.integration.dashboard.helpers import make_user


def _client(role: str, *, enforce_csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=enforce_csrf)
    client.force_login(make_user(role))
    return client


@pytest.fixture
def operator_client(db) -> Client:
    return _client("operator")


@pytest.fixture
def viewer_client(db) -> Client:
    return _client("viewer")


@pytest.fixture
def nobody_client(db) -> Client:
    return _client("nobody")


@pytest.fixture
def admin_client_(db) -> Client:
    return _client("admin")
