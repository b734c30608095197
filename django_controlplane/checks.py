"""``manage.py check``: what a host project still lacks, each message naming its fix.

``configure(globals())`` adds nearly everything; these catch the rest (the
URLconf entry) and a settings file that never called it or undid part of it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from django_controlplane.host_settings import (
    APPS,
    CONFIGURED,
    OVERLOAD_MIDDLEWARE,
    STATIC_MIDDLEWARE,
)

TAG = "controlplane"
REQUIRED_APPS = (
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
)
REQUIRED_MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
)


def register() -> None:
    checks.register(check_configured, TAG)
    checks.register(check_apps, TAG)
    checks.register(check_middleware, TAG)
    checks.register(check_static_files, TAG)
    checks.register(check_mounted, TAG, checks.Tags.urls)
    checks.register(check_secret_key, TAG, checks.Tags.security)
    from django_controlplane.remote.grants import check_grants

    checks.register(check_grants, TAG)


# Keys that ship in source: the demo's default and what ``startproject`` writes.
BUILT_IN_SECRET_KEYS = ("dev-only-insecure-key-change-me-in-production-0123456789",)
INSECURE_PREFIXES = ("django-insecure-", "dev-only-insecure")


def check_secret_key(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A key anyone can read in the source signs sessions and password resets: say so
    whenever DEBUG is off, not only under ``check --deploy``."""
    key = str(getattr(settings, "SECRET_KEY", "") or "")
    if settings.DEBUG or not (key in BUILT_IN_SECRET_KEYS or key.startswith(INSECURE_PREFIXES)):
        return []
    return [
        checks.Warning(
            "SECRET_KEY is a built-in key that ships in source code, while DEBUG is off: "
            "anyone can forge session cookies and password-reset links.",
            hint="Set DJANGO_SECRET_KEY (or SECRET_KEY) to a long random value, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'.",
            id="controlplane.W001",
        )
    ]


def check_configured(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if getattr(settings, CONFIGURED, False):
        return []
    return [
        checks.Error(
            "The settings were not completed for the control plane.",
            hint="End settings.py with: import django_controlplane; "
            "django_controlplane.configure(globals())",
            id="controlplane.E001",
        )
    ]


def check_apps(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    installed = list(settings.INSTALLED_APPS)
    errors: list[checks.CheckMessage] = []
    ours = [app for app in APPS if app != APPS[0]]
    missing = [app for app in (*ours, *REQUIRED_APPS) if app not in installed]
    if missing:
        errors.append(
            checks.Error(
                f"INSTALLED_APPS lacks {', '.join(missing)}.",
                hint="Add them, or let django_controlplane.configure(globals()) add ours.",
                id="controlplane.E002",
            )
        )
    if "channels" in installed and "workers" in installed:
        if installed.index("channels") < installed.index("workers"):
            errors.append(
                checks.Error(
                    '"channels" comes before "workers" in INSTALLED_APPS, so Channels\' '
                    "runworker command replaces the control plane's.",
                    hint='List "workers" (or *django_controlplane.APPS) before "channels".',
                    id="controlplane.E003",
                )
            )
    return errors


def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    middleware = list(settings.MIDDLEWARE)
    missing = [
        name
        for name in (STATIC_MIDDLEWARE, OVERLOAD_MIDDLEWARE, *REQUIRED_MIDDLEWARE)
        if name not in middleware
    ]
    if not missing:
        return []
    return [
        checks.Error(
            f"MIDDLEWARE lacks {', '.join(missing)}.",
            hint="Add them (django_controlplane.configure(globals()) adds the first two, "
            "after SecurityMiddleware); without them the dashboard has no styles, no "
            "sign-in or no 503 when the database is down.",
            id="controlplane.E004",
        )
    ]


def check_static_files(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if getattr(settings, "STATIC_ROOT", None):
        return []
    return [
        checks.Error(
            "STATIC_ROOT is not set, so manage.py serve cannot collect the dashboard's "
            "styles and scripts.",
            hint='Set STATIC_ROOT = BASE_DIR / "staticfiles" (configure() does when '
            "settings.py defines BASE_DIR).",
            id="controlplane.E005",
        )
    ]


def check_mounted(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from django_controlplane.mount import NotMounted, mount_prefix

    try:
        mount_prefix()
    except NotMounted as error:
        return [
            checks.Error(
                str(error),
                hint='In your urls.py: path("ops/", include("django_controlplane.urls")).',
                id="controlplane.E006",
            )
        ]
    return []
