"""Moving a database made before the ``controlplane`` app label to the new names.

Until version 0.2 the app's label was ``jobs``: its tables were ``jobs_job``,
``jobs_jobevent``… and its migrations were recorded under ``jobs``. The label
is now ``controlplane`` (a host project's own ``jobs`` app can sit beside it),
so such a database needs its tables renamed and its records relabelled before
``migrate`` runs. ``manage.py controlplane_relabel`` does that in one
transaction; without it the first migration refuses to create empty tables
next to the old ones (``refuse_legacy_tables``).
"""

from __future__ import annotations

import importlib

from django.apps import apps
from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper

OLD_LABEL = "jobs"
LEGACY_MARKER = "jobs_jobevent"  # present only in a database of the old layout

LEGACY_FUNCTIONS = """
DROP TRIGGER IF EXISTS jobs_jobevent_notify ON jobs_jobevent;
DROP FUNCTION IF EXISTS jobs_jobevent_notify();
DROP FUNCTION IF EXISTS jobs_claimable_ids(text[], timestamptz, int, text[], text[]);
"""


def _recorded_under_old_label(connection: BaseDatabaseWrapper) -> bool:
    if "django_migrations" not in connection.introspection.table_names():
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM django_migrations WHERE app = %s AND name = %s",
            [OLD_LABEL, "0001_initial"],
        )
        return cursor.fetchone() is not None


def has_legacy_tables(connection: BaseDatabaseWrapper) -> bool:
    """True when this database holds the control plane's tables under the old label."""
    return LEGACY_MARKER in connection.introspection.table_names() and _recorded_under_old_label(
        connection
    )


def refuse_legacy_tables(apps_state: object, schema_editor: object) -> None:
    """First step of the first migration: never start empty beside the old tables."""
    connection = schema_editor.connection  # type: ignore[attr-defined]
    if has_legacy_tables(connection):
        raise RuntimeError(
            "This database holds the control plane's tables under their old names "
            "(jobs_job, jobs_jobevent…). Run `python manage.py controlplane_relabel` "
            "once to rename them, then `python manage.py migrate` again."
        )


# The migrations that (re)wrote ``controlplane_claimable_ids``, newest first.
_CLAIMABLE_IDS_MIGRATIONS = ("0016_flow_keys", "0004_claimable_ids_function")


def _claimable_ids_migration(cursor: object) -> str:
    """The newest migration that wrote the pick's function and is applied to this database."""
    for name in _CLAIMABLE_IDS_MIGRATIONS:
        cursor.execute(  # type: ignore[attr-defined]
            "SELECT 1 FROM django_migrations WHERE app IN (%s, %s) AND name = %s",
            [OLD_LABEL, "controlplane", name],
        )
        if cursor.fetchone():  # type: ignore[attr-defined]
            return name
    return _CLAIMABLE_IDS_MIGRATIONS[-1]


def _migration_sql(module: str, name: str) -> str:
    return getattr(importlib.import_module(f"jobs.migrations.{module}"), name)


def relabel(connection: BaseDatabaseWrapper) -> list[str]:
    """Rename the old tables and relabel the migration, content type and permission records.

    Returns the renamed tables (empty when there was nothing to do). PostgreSQL's
    trigger and claim function are made again under their new names, reading the
    renamed tables. Permissions follow their content type, so groups and users
    keep what they were granted.
    """
    if not has_legacy_tables(connection):
        return []
    existing = set(connection.introspection.table_names())
    renamed = []
    quote = connection.ops.quote_name
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(LEGACY_FUNCTIONS)
        for model in apps.get_app_config("controlplane").get_models():
            old = f"{OLD_LABEL}_{model._meta.model_name}"
            if old in existing:
                cursor.execute(f"ALTER TABLE {quote(old)} RENAME TO {quote(model._meta.db_table)}")
                renamed.append(model._meta.db_table)
        if connection.vendor == "postgresql":
            cursor.execute(_migration_sql("0002_operator_action_and_index_tuning", "CREATE_NOTIFY"))
            cursor.execute(_migration_sql(_claimable_ids_migration(cursor), "CREATE_FUNCTION"))
        cursor.execute(
            "UPDATE django_migrations SET app = %s WHERE app = %s", ["controlplane", OLD_LABEL]
        )
        if "django_content_type" in existing:
            cursor.execute(
                "UPDATE django_content_type SET app_label = %s WHERE app_label = %s",
                ["controlplane", OLD_LABEL],
            )
    return renamed
