"""App configs of the project itself (not of the reusable apps a host project adds)."""

from __future__ import annotations

from django.apps import AppConfig


class DevServerConfig(AppConfig):
    """Daphne's ``runserver`` (ASGI, WebSockets included) without importing Daphne at start-up.

    ``daphne.apps`` imports ``daphne.server`` and so Twisted and Autobahn
    (about 0.3 s of CPU) in every process that loads the settings: workers,
    the reaper, ``migrate``. This config names the same ``daphne`` package, so
    its ``runserver`` command still replaces Django's (listed before
    ``django.contrib.staticfiles``), but nothing of Daphne loads until that
    command does: its module imports ``daphne.server`` itself, first thing.
    Daphne's own check (daphne.E001, "before staticfiles") needs its config
    class, so it does not apply; the order here is fixed in the settings.
    """

    name = "daphne"
    label = "daphne"
    verbose_name = "Daphne (development server)"
