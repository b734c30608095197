"""Settings for the control plane.

Everything an operator changes comes from the environment: ``DATABASE_URL``
(behind PgBouncer also ``DATABASE_DIRECT_URL``, ``CONTROLPLANE_DB_POOLER``: ``jobs.pooling``),
``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS`` and one
``CONTROLPLANE_<KNOB>`` variable per timing knob (see ``jobs.conf``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, cast

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from jobs import CONTROLPLANE_APPS
from jobs.pooling import configure_database

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me-in-production-0123456789"
)
DEBUG = os.environ.get("DJANGO_DEBUG", "0").lower() in {"1", "true", "yes", "on"}
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if h.strip()
]

INSTALLED_APPS = [
    "controlplane.apps.DevServerConfig",  # Daphne's runserver (ASGI, WebSockets), loaded lazily
    # The control plane's apps, as a host project adds them (README).
    *CONTROLPLANE_APPS,
    "controlplane.apps.AdminConfig",  # django.contrib.admin, discovered where it is used
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "controlplane.apps.StartedConfig",  # last: set-up is over (see manage.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from this process: compressed, far-future cache on hashed names.
    "jobs.web.static.StaticFilesMiddleware",
    "jobs.web.overload.DatabaseUnavailableMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


# Web processes (``controlplane.asgi`` sets CONTROLPLANE_DB_POOL=1) take PostgreSQL
# connections from one bounded pool per process, so a process never holds more
# than WEB_DB_POOL_SIZE of them, however many clients it serves. Workers and
# commands keep one persistent connection per thread (their threads are few and fixed).
DB_POOL = _env_flag("CONTROLPLANE_DB_POOL")
WEB_THREADS = int(os.environ.get("CONTROLPLANE_WEB_THREADS") or 1)
WEB_DB_POOL_SIZE = int(os.environ.get("CONTROLPLANE_WEB_DB_POOL_SIZE") or WEB_THREADS + 2)
WEB_DB_POOL_TIMEOUT_SECONDS = float(os.environ.get("CONTROLPLANE_WEB_DB_POOL_TIMEOUT_SECONDS") or 5)


def _database_config() -> dj_database_url.DBConfig:
    url = os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
    config = dj_database_url.parse(
        url, conn_max_age=0 if DB_POOL else 600, conn_health_checks=not DB_POOL
    )
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # WAL lets readers run beside the one writer; IMMEDIATE takes the write
        # lock when a transaction opens, so two workers queue on busy_timeout
        # instead of failing with "database is locked" on lock upgrade.
        config["OPTIONS"] = {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # Tests with worker subprocesses need a file, not :memory:.
        name = Path(config["NAME"])
        config["TEST"] = {
            "NAME": os.environ.get(
                "CONTROLPLANE_TEST_DB_NAME", str(name.with_name(f"test_{name.name}"))
            )
        }
    else:
        config.setdefault("OPTIONS", {})
        if DB_POOL:
            # Named per process, so an operator (and the tests) can count what each holds.
            config["OPTIONS"]["application_name"] = f"controlplane-web-{os.getpid()}"
            config["OPTIONS"]["pool"] = {
                "min_size": min(2, WEB_DB_POOL_SIZE),
                "max_size": WEB_DB_POOL_SIZE,
                "timeout": WEB_DB_POOL_TIMEOUT_SECONDS,
                "name": "controlplane-web",
            }
        config["TEST"] = {"NAME": os.environ.get("CONTROLPLANE_TEST_DB_NAME")}
        # Behind PgBouncer (transaction mode): DATABASE_URL names the pooler,
        # DATABASE_DIRECT_URL PostgreSQL itself for LISTEN and the workers'
        # liveness locks; CONTROLPLANE_DB_POOLER=transaction|none overrides
        # the guess (a direct URL to another server means pooled). See jobs.pooling.
        configure_database(
            cast(dict[str, Any], config),  # a TypedDict to mypy, a dict at run time
            direct_url=os.environ.get("DATABASE_DIRECT_URL"),
            pooler=os.environ.get("CONTROLPLANE_DB_POOLER"),
        )
    return config


DATABASES = {"default": _database_config()}


def _replica_config(url: str) -> dj_database_url.DBConfig:
    """The read replica's alias: the primary's connection options, another server.

    Under the test runner the alias mirrors the test database (a read-only
    standby cannot host a created test database); tests/integration/replica
    starts a real standby and points the alias at it instead.
    """
    primary = DATABASES["default"]
    if primary["ENGINE"] == "django.db.backends.sqlite3":
        raise ImproperlyConfigured("DATABASE_REPLICA_URL needs a PostgreSQL DATABASE_URL.")
    config = dj_database_url.parse(
        url,
        conn_max_age=primary.get("CONN_MAX_AGE", 0),
        conn_health_checks=primary.get("CONN_HEALTH_CHECKS", False),
    )
    options = dict(primary.get("OPTIONS", {}))
    if "pool" in options:
        options["pool"] = {**options["pool"], "name": "controlplane-web-replica"}
    options["connect_timeout"] = 2  # a replica that is down costs a check at most this long
    config["OPTIONS"] = {**options, **config.get("OPTIONS", {})}
    config["DISABLE_SERVER_SIDE_CURSORS"] = primary.get("DISABLE_SERVER_SIDE_CURSORS", False)
    config["TEST"] = {"MIRROR": "default"}
    return config


# DATABASE_REPLICA_URL: a streaming replica of DATABASE_URL. Dashboard pages, API
# lists and /metrics read from it while it keeps up; everything else uses the
# primary (jobs.replica, README "Read replica").
if os.environ.get("DATABASE_REPLICA_URL"):
    DATABASES["replica"] = _replica_config(os.environ["DATABASE_REPLICA_URL"])
    DATABASE_ROUTERS = ["jobs.replica.ReplicaRouter"]
    MIDDLEWARE.append("jobs.replica.StickyPrimaryMiddleware")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("CONTROLPLANE_STATIC_ROOT") or BASE_DIR / "staticfiles")
# ``manage.py serve`` collects them and sets CONTROLPLANE_STATIC_MANIFEST=1: files are
# then served under hashed names, compressed, with far-future cache headers.
# Elsewhere (tests, ``runserver``, plain daphne) WhiteNoise serves them from the
# apps' folders as they are, with a short cache.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if _env_flag("CONTROLPLANE_STATIC_MANIFEST")
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = True
# STATIC_ROOT exists only after collectstatic; serving from the finders is the intent before it.
warnings.filterwarnings("ignore", message="No directory at", module="whitenoise.base")

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Oversized request bodies are refused before they reach a view.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("CONTROLPLANE_MAX_BODY_BYTES", 2 * 1024 * 1024))

# The REST API sets its DRF choices on its own views (jobs.api.defaults): nothing
# here, so a host project's REST_FRAMEWORK and SPECTACULAR_SETTINGS stay its own.


TASKS = {
    "default": {
        "BACKEND": "jobs.tasks_backend.ControlPlaneTaskBackend",
        "QUEUES": [],
    }
}

# Timing knobs and limits; each is overridable by CONTROLPLANE_<NAME>.
CONTROLPLANE: dict = {}

# CONTROLPLANE_LOG_FORMAT=json: one JSON object per line (jobs.logging_json); the same
# variable is the LOG_FORMAT knob, which makes workers log every claim and success.
LOG_FORMAT = "json" if os.environ.get("CONTROLPLANE_LOG_FORMAT", "").lower() == "json" else "plain"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "jobs.logging_json.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "loggers": {
        "jobs": {
            "handlers": ["console"],
            "level": os.environ.get("CONTROLPLANE_LOG_LEVEL", "INFO"),
        },
        "workers": {
            "handlers": ["console"],
            "level": os.environ.get("CONTROLPLANE_LOG_LEVEL", "INFO"),
        },
    },
}
