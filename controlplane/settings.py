"""Settings of the repository's own deployment: a host project like any other.

It is what ``django-admin startproject`` writes, with the README's recipe
("Adding it to your Django project") applied, and its deployment values
taken from the environment: ``DATABASE_URL`` (default: a SQLite file beside
``manage.py``), ``DATABASE_REPLICA_URL``, ``DJANGO_SECRET_KEY``,
``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``, and one ``CONTROLPLANE_<KNOB>``
variable per knob (``jobs.conf``). Nothing here is private wiring: every
test and benchmark of this project measures what a user's project gets.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

import django_controlplane

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
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=600,
        conn_health_checks=True,
    )
}
# DATABASE_REPLICA_URL: a streaming replica of DATABASE_URL. Dashboard pages, API
# lists and /metrics read from it while it keeps up (jobs.replica, docs/deploying.md).
if os.environ.get("DATABASE_REPLICA_URL"):
    DATABASES["replica"] = dj_database_url.parse(os.environ["DATABASE_REPLICA_URL"])
# The test suite names its test database (./scripts/dev: one per pass).
if os.environ.get("CONTROLPLANE_TEST_DB_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["CONTROLPLANE_TEST_DB_NAME"]}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Oversized request bodies are refused before they reach a view.
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("CONTROLPLANE_MAX_BODY_BYTES", 2 * 1024 * 1024))

# django.tasks' default backend enqueues through the control plane.
TASKS = {"default": {"BACKEND": "jobs.tasks_backend.ControlPlaneTaskBackend", "QUEUES": []}}

# Knobs (jobs.conf); each is also overridable by CONTROLPLANE_<NAME>.
CONTROLPLANE: dict = {}

django_controlplane.configure(globals())
