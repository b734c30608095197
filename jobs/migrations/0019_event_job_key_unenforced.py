"""The events' ``job_id`` is no longer a foreign key in the database (``JobEvent.job``).

Events are written only under their job's row lock, and every path that
deletes jobs deletes their events in the same transaction; the key's check
at commit, one per event, was about a tenth of a drain's database CPU
(bench/README.md). On PostgreSQL the key is dropped by name if it is there:
a table partitioned by ``jobs.event_layout`` never had one. Elsewhere (SQLite)
Django's own AlterField remakes the table without it.
"""

import django.db.models.deletion
from django.db import migrations, models


def _event_foreign_keys(cursor) -> list[str]:
    cursor.execute(
        "SELECT conname FROM pg_constraint "
        "WHERE conrelid = 'controlplane_jobevent'::regclass AND contype = 'f'"
    )
    return [name for (name,) in cursor.fetchall()]


class DropEventJobKey(migrations.AlterField):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        with schema_editor.connection.cursor() as cursor:
            for name in _event_foreign_keys(cursor):
                cursor.execute(f'ALTER TABLE controlplane_jobevent DROP CONSTRAINT "{name}"')

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            from jobs.partitions import is_partitioned

            # A partitioned table keeps no key (jobs.event_layout).
            if is_partitioned(schema_editor.connection):
                return
            with schema_editor.connection.cursor() as cursor:
                cursor.execute(
                    "DELETE FROM controlplane_jobevent e WHERE NOT EXISTS "
                    "(SELECT 1 FROM controlplane_job j WHERE j.id = e.job_id)"
                )
        return super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0018_schedule_workflows"),
    ]

    operations = [
        DropEventJobKey(
            model_name="jobevent",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="controlplane.job",
            ),
        ),
    ]
