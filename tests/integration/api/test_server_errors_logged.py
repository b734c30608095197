"""Every 500 is logged with a request id, and the answer names that id (DEBUG off)."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from jobs import selectors

pytestmark = pytest.mark.django_db


def _break(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(selectors, "queue_stats", broken)


def test_a_500_is_logged_with_the_request_id_it_answers(viewer, monkeypatch, caplog, settings):
    settings.DEBUG = False
    _break(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="django_controlplane.api"):
        response = Client(raise_request_exception=False).get("/queues", headers=viewer.headers)
    assert response.status_code == 500
    rid = response["X-Request-ID"]
    assert rid and rid in response.json()["message"]
    assert b"secret internal detail" not in response.content
    lines = [
        r for r in caplog.records if r.name == "django_controlplane.api" and rid in r.getMessage()
    ]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].levelno == logging.ERROR and "GET /queues" in lines[0].getMessage()
    assert lines[0].exc_info and "secret internal detail" in str(lines[0].exc_info[1])
    # The line reaches a handler that writes it (the console), not only the test's capture.
    assert any(
        isinstance(h, logging.StreamHandler)
        for h in logging.getLogger("django_controlplane").handlers
    )


def test_a_client_request_id_is_kept(viewer, monkeypatch, caplog):
    _break(monkeypatch)
    headers = {**viewer.headers, "X-Request-ID": "req-42.a"}
    with caplog.at_level(logging.ERROR, logger="django_controlplane.api"):
        response = Client(raise_request_exception=False).get("/queues", headers=headers)
    assert response["X-Request-ID"] == "req-42.a"
    assert any("req-42.a" in r.getMessage() for r in caplog.records)
    hostile = {**viewer.headers, "X-Request-ID": "a b\\n<script>"}
    response = Client(raise_request_exception=False).get("/queues", headers=hostile)
    assert response["X-Request-ID"] != "a b\\n<script>"
