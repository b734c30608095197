"""``configure(globals())``: a host project's settings, completed for the control plane.

Each step adds what is missing and keeps what the project set: its own
middleware order, database options, logging, static storage and login URL
win. What cannot be added here (the URLconf entry, the ASGI module a server
other than ``manage.py serve`` loads) is checked by ``manage.py check``
(``django_controlplane.checks``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

APPS = [
    # Daphne's runserver (ASGI, WebSockets) without importing Daphne at start-up;
    # before django.contrib.staticfiles so its runserver wins.
    "django_controlplane.apps.DevServerConfig",
    # Before "channels": our runworker replaces Channels' command of that name.
    "workers",
    "jobs",
    "dashboard",
    "django_controlplane",
    "rest_framework",
    "rest_framework.authtoken",
    "channels",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]

STATIC_MIDDLEWARE = "django_controlplane.web.static.StaticFilesMiddleware"
OVERLOAD_MIDDLEWARE = "django_controlplane.web.overload.DatabaseUnavailableMiddleware"
SECURITY_MIDDLEWARE = "django.middleware.security.SecurityMiddleware"

ASGI_APPLICATION = "django_controlplane.asgi.application"
LOGIN_URL = "dashboard:login"
DEFAULT_LOGIN_URL = "/accounts/login/"  # Django's default: a project that kept it has no page there

CONFIGURED = "CONTROLPLANE_CONFIGURED"  # set by configure(); the system checks look for it


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def configure(settings: MutableMapping[str, Any]) -> None:
    """Complete ``settings`` (a settings module's ``globals()``) for the control plane.

    Call it last in ``settings.py``, after ``INSTALLED_APPS``, ``MIDDLEWARE``
    and ``DATABASES``, whose entries it reads. Environment variables a
    deployment may set: ``CONTROLPLANE_DB_POOL`` (set by
    ``django_controlplane.asgi``), ``CONTROLPLANE_WEB_THREADS``,
    ``CONTROLPLANE_WEB_DB_POOL_SIZE``, ``CONTROLPLANE_WEB_DB_POOL_TIMEOUT_SECONDS``,
    ``CONTROLPLANE_STATIC_ROOT``, ``CONTROLPLANE_LOG_FORMAT``,
    ``CONTROLPLANE_LOG_LEVEL``, ``DATABASE_DIRECT_URL`` and
    ``CONTROLPLANE_DB_POOLER`` (PgBouncer, ``jobs.pooling``).
    """
    _apps(settings)
    _middleware(settings)
    _databases(settings)
    _static_files(settings)
    _serving(settings)
    _logging(settings)
    settings[CONFIGURED] = True


def _apps(settings: MutableMapping[str, Any]) -> None:
    """Ours first (so our commands win), except what the project lists already."""
    installed = list(settings.get("INSTALLED_APPS", []))
    present = set(installed)
    if "daphne" in present:  # the project's own Daphne config: its runserver already wins
        present.add(APPS[0])
    missing = [app for app in APPS if app not in present]
    settings["INSTALLED_APPS"] = [*missing, *installed]


def _middleware(settings: MutableMapping[str, Any]) -> None:
    """Static files and the database-unavailable 503, right after the security middleware."""
    middleware = list(settings.get("MIDDLEWARE", []))
    at = middleware.index(SECURITY_MIDDLEWARE) + 1 if SECURITY_MIDDLEWARE in middleware else 0
    for name in (STATIC_MIDDLEWARE, OVERLOAD_MIDDLEWARE):
        if name not in middleware:
            middleware.insert(at, name)
        at = middleware.index(name) + 1
    if "replica" in settings.get("DATABASES", {}):
        sticky = "jobs.replica.StickyPrimaryMiddleware"
        if sticky not in middleware:
            middleware.append(sticky)
    settings["MIDDLEWARE"] = middleware


# Threads per web process for synchronous views (why two: ``django_controlplane.web.threads``).
# Here, not there: every process reads its settings, and workers import no web module.
DEFAULT_WEB_THREADS = 2


def _web_pool_size(settings: MutableMapping[str, Any]) -> int:
    threads = int(
        settings.get("WEB_THREADS")
        or os.environ.get("CONTROLPLANE_WEB_THREADS")
        or DEFAULT_WEB_THREADS
    )
    settings.setdefault("WEB_THREADS", threads)
    size = os.environ.get("CONTROLPLANE_WEB_DB_POOL_SIZE") or settings.get("WEB_DB_POOL_SIZE")
    settings["WEB_DB_POOL_SIZE"] = int(size or threads + 2)
    timeout = os.environ.get("CONTROLPLANE_WEB_DB_POOL_TIMEOUT_SECONDS") or settings.get(
        "WEB_DB_POOL_TIMEOUT_SECONDS"
    )
    settings["WEB_DB_POOL_TIMEOUT_SECONDS"] = float(timeout or 5)
    return int(settings["WEB_DB_POOL_SIZE"])


def _databases(settings: MutableMapping[str, Any]) -> None:
    """SQLite for several processes at once; PostgreSQL pooled in web processes.

    A web process (``django_controlplane.asgi`` sets ``CONTROLPLANE_DB_POOL=1``)
    takes its PostgreSQL connections from one bounded pool, so it never holds
    more than ``WEB_DB_POOL_SIZE`` however many clients it serves. Workers and
    commands keep one connection per thread (their threads are few and fixed).
    """
    from jobs.pooling import configure_database

    databases = settings.get("DATABASES") or {}
    pooled = env_flag("CONTROLPLANE_DB_POOL")
    size = _web_pool_size(settings)
    settings["DB_POOL"] = pooled
    for alias, config in databases.items():
        engine = config.get("ENGINE", "")
        if engine == "django.db.backends.sqlite3":
            _sqlite(config)
        elif engine == "django.db.backends.postgresql":
            options = config.setdefault("OPTIONS", {})
            if pooled and "pool" not in options:
                config["CONN_MAX_AGE"] = 0
                config["CONN_HEALTH_CHECKS"] = False
                # Named per process, so an operator can count what each holds.
                options.setdefault("application_name", f"controlplane-web-{os.getpid()}")
                options["pool"] = {
                    "min_size": min(2, size),
                    "max_size": size,
                    "timeout": settings["WEB_DB_POOL_TIMEOUT_SECONDS"],
                    "name": f"controlplane-web-{alias}",
                }
            if alias == "default" and "POOLER" not in config:
                # Behind PgBouncer (transaction mode): DATABASE_URL names the pooler,
                # DATABASE_DIRECT_URL PostgreSQL itself (jobs.pooling).
                configure_database(
                    config,
                    direct_url=os.environ.get("DATABASE_DIRECT_URL"),
                    pooler=os.environ.get("CONTROLPLANE_DB_POOLER"),
                )
    if "replica" in databases:
        _replica(databases["replica"], databases.get("default", {}))
        routers = list(settings.get("DATABASE_ROUTERS", []))
        if "jobs.replica.ReplicaRouter" not in routers:
            settings["DATABASE_ROUTERS"] = [*routers, "jobs.replica.ReplicaRouter"]


def _sqlite(config: dict[str, Any]) -> None:
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock
    # when a transaction opens, so two workers queue on busy_timeout instead of
    # failing with "database is locked" on lock upgrade.
    options = config.setdefault("OPTIONS", {})
    options.setdefault("timeout", 30)
    options.setdefault("transaction_mode", "IMMEDIATE")
    options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
    # Tests run workers as subprocesses: the test database must be a file, not :memory:.
    test = config.setdefault("TEST", {})
    if not test.get("NAME"):
        name = Path(str(config.get("NAME") or "db.sqlite3"))
        test["NAME"] = str(name.with_name(f"test_{name.name}"))


def _replica(replica: dict[str, Any], primary: dict[str, Any]) -> None:
    """A streaming replica of ``default``: the primary's connection options, another server.

    Under the test runner the alias mirrors the test database (a read-only
    standby cannot host a created test database).
    """
    from django.core.exceptions import ImproperlyConfigured

    if primary.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured("A 'replica' database needs a PostgreSQL 'default'.")
    options = {**primary.get("OPTIONS", {}), **replica.get("OPTIONS", {})}
    if "pool" in options:
        options["pool"] = {**options["pool"], "name": "controlplane-web-replica"}
    options.setdefault("connect_timeout", 2)  # a replica that is down costs a check at most this
    replica["OPTIONS"] = options
    for key in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS", "DISABLE_SERVER_SIDE_CURSORS"):
        if key in primary:
            replica[key] = primary[key]
    replica.setdefault("TEST", {"MIRROR": "default"})


def _static_files(settings: MutableMapping[str, Any]) -> None:
    """Static files served by the web process itself (WhiteNoise).

    ``manage.py serve`` collects them and sets ``CONTROLPLANE_STATIC_MANIFEST=1``:
    files are then served under hashed names, compressed, with far-future cache
    headers. Elsewhere (tests, ``runserver``) they are served from the apps'
    folders as they are, with a short cache.
    """
    settings.setdefault("STATIC_URL", "static/")
    if os.environ.get("CONTROLPLANE_STATIC_ROOT"):
        settings["STATIC_ROOT"] = os.environ["CONTROLPLANE_STATIC_ROOT"]
    elif not settings.get("STATIC_ROOT"):
        base = settings.get("BASE_DIR")
        if base is not None:
            settings["STATIC_ROOT"] = Path(base) / "staticfiles"
    storages = dict(settings.get("STORAGES") or {})
    storages.setdefault("default", {"BACKEND": "django.core.files.storage.FileSystemStorage"})
    plain = "django.contrib.staticfiles.storage.StaticFilesStorage"
    if storages.get("staticfiles", {}).get("BACKEND", plain) == plain or env_flag(
        "CONTROLPLANE_STATIC_MANIFEST"
    ):
        storages["staticfiles"] = {
            "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if env_flag("CONTROLPLANE_STATIC_MANIFEST")
            else plain
        }
    settings["STORAGES"] = storages
    settings.setdefault("WHITENOISE_USE_FINDERS", True)
    # STATIC_ROOT exists only after collectstatic; serving from the finders is the intent before.
    warnings.filterwarnings("ignore", message="No directory at", module="whitenoise.base")


def _serving(settings: MutableMapping[str, Any]) -> None:
    """The ASGI application ``manage.py serve`` and ``runserver`` load, and the sign-in page."""
    settings.setdefault("ASGI_APPLICATION", ASGI_APPLICATION)
    if settings.get("LOGIN_URL", DEFAULT_LOGIN_URL) == DEFAULT_LOGIN_URL:
        settings["LOGIN_URL"] = LOGIN_URL


def _logging(settings: MutableMapping[str, Any]) -> None:
    """The control plane's lines on stderr (workers, reaper, API errors), unless the project
    routes them itself.

    ``CONTROLPLANE_LOG_FORMAT=json`` writes one JSON object per line
    (``jobs.logging_json``).
    """
    knobs = settings.get("CONTROLPLANE") or {}
    chosen = os.environ.get("CONTROLPLANE_LOG_FORMAT") or knobs.get("LOG_FORMAT") or ""
    json_lines = str(chosen).strip().lower() == "json"
    logging = settings.setdefault("LOGGING", {"version": 1, "disable_existing_loggers": False})
    formatters = logging.setdefault("formatters", {})
    formatters.setdefault(
        "controlplane", {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}
    )
    formatters.setdefault("controlplane_json", {"()": "jobs.logging_json.JsonFormatter"})
    handlers = logging.setdefault("handlers", {})
    handlers.setdefault(
        "controlplane_console",
        {
            "class": "logging.StreamHandler",
            "formatter": "controlplane_json" if json_lines else "controlplane",
        },
    )
    loggers = logging.setdefault("loggers", {})
    for name in ("jobs", "workers", "dashboard", "django_controlplane"):
        loggers.setdefault(
            name,
            {
                "handlers": ["controlplane_console"],
                "level": os.environ.get("CONTROLPLANE_LOG_LEVEL", "INFO"),
            },
        )
