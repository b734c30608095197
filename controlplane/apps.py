"""App configs of the project itself (not of the reusable apps a host project adds)."""

from __future__ import annotations

import gc

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


class StartedConfig(AppConfig):
    """Last in ``INSTALLED_APPS``: set-up is over, so the cyclic collector runs again.

    ``manage.py`` switches the collector off for the set-up (a tenth of a
    worker's start-up CPU went to walking objects that live as long as the
    process). Here what set-up made is frozen out of the collector's way
    (``gc.freeze``: later collections, and the pages of forked
    ``runworker --processes`` children, leave it alone) and collection
    resumes. A process that set Django up otherwise (ASGI, tests) had the
    collector on all along and is left as it is.
    """

    name = "controlplane"
    label = "controlplane_started"
    verbose_name = "Control plane deployment"

    def ready(self) -> None:
        if not gc.isenabled():
            gc.freeze()
            gc.enable()
