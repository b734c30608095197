"""Fixtures for the dashboard's integration tests: a logged-in client per role."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from tests.factories import make_user


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


@pytest.fixture(scope="session", autouse=True)
def _close_the_listen_connection(django_db_setup, django_db_blocker) -> Iterator[None]:
    """The relays' shared LISTEN connection (PostgreSQL) must close before the test
    database is dropped; it is torn down before ``django_db_setup``, which it depends on."""
    yield
    from django_controlplane.web.listener import listener

    listener.stop()
