"""App configs of the host integration: its system checks, and Daphne's runserver loaded lazily."""

from __future__ import annotations

from django.apps import AppConfig


class ControlPlaneHostConfig(AppConfig):
    """The host integration itself: registers the system checks of ``manage.py check``."""

    default = True
    name = "django_controlplane"
    label = "django_controlplane"
    verbose_name = "Control plane (host integration)"

    def ready(self) -> None:
        from django_controlplane import checks

        checks.register()


class DevServerConfig(AppConfig):
    """Daphne's ``runserver`` (ASGI, WebSockets included) without importing Daphne at start-up.

    ``daphne.apps`` imports ``daphne.server`` and so Twisted and Autobahn
    (about 0.3 s of CPU) in every process that loads the settings: workers,
    the reaper, ``migrate``. This config names the same ``daphne`` package, so
    its ``runserver`` command still replaces Django's (listed before
    ``django.contrib.staticfiles``), but nothing of Daphne loads until that
    command does: its module imports ``daphne.server`` itself, first thing.
    """

    name = "daphne"
    label = "daphne"
    verbose_name = "Daphne (development server)"
