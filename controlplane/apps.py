"""App configs of the project itself (not of the reusable apps a host project adds)."""

from __future__ import annotations

import gc
from typing import Any

from django.apps import AppConfig
from django.contrib.admin.apps import SimpleAdminConfig
from django.contrib.admin.checks import check_admin_app, check_dependencies
from django.core import checks


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


class AdminConfig(SimpleAdminConfig):
    """Django's admin, with each app's ``admin`` module loaded where the admin is used.

    Django's own ``AdminConfig`` imports every ``admin`` module at set-up, in
    every process: ``jobs.admin`` with the dashboard's actions, selectors and
    permissions, DRF's token admin, the auth forms (about 6% of a worker's
    start-up CPU). Workers, the reaper and ``migrate`` never show a page.
    Discovery happens instead where the admin is used: the URLconf
    (``controlplane.urls``, before ``admin.site.urls``), and the admin's
    system checks (``manage.py check``, ``runserver``), which may run before
    the URL check loads the URLconf. The checks are Django's own, registered
    as ``SimpleAdminConfig`` does, with discovery first.
    """

    def ready(self) -> None:
        checks.register(check_dependencies, checks.Tags.admin)
        checks.register(check_discovered_admin, checks.Tags.admin)


def check_discovered_admin(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Django's admin checks, over the ``ModelAdmin`` classes of every app's ``admin`` module."""
    from django.contrib import admin

    admin.autodiscover()
    return check_admin_app(app_configs, **kwargs)


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
