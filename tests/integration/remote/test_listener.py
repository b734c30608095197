"""The process's shared LISTEN thread, against a real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from django_controlplane.web.listener import Listener

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY: PostgreSQL"),
]


def test_a_channel_subscribed_while_connected_gets_its_catch_up_call_and_its_notifies() -> None:
    """A subscriber arriving after the thread connected (the dashboard relay after the
    remote relay) must still be told when its LISTEN takes effect: a NOTIFY sent before
    that moment is lost, and only the catch-up call makes it look for what it missed."""
    listener = Listener()
    try:
        listener.subscribe("cp_test_first", lambda payload: None)
        assert listener.connected.wait(5), "the listener never connected"

        caught_up = threading.Event()
        heard: list[str] = []
        got = threading.Event()

        def hear(payload: str) -> None:
            heard.append(payload)
            got.set()

        listener.subscribe("cp_test_second", hear, on_connect=caught_up.set)
        assert caught_up.wait(5), "no catch-up call after the new channel's LISTEN"
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('cp_test_second', 'hello')")
        assert got.wait(5) and heard == ["hello"]
        assert listener.connections == 1  # the same session, not a reconnect
    finally:
        listener.stop()
