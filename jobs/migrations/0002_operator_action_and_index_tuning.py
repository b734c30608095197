"""Operator audit log, leaner Job indexes, and a NOTIFY on new events (PostgreSQL).

* ``OperatorAction``: the dashboard's record of who cancelled, retried,
  paused... what, and why.
* ``job_parent_idx``, ``job_finished_idx`` and ``job_worker_idx`` become
  partial: a freshly enqueued job (no parent, not finished, not running)
  touches none of them, which cuts the index work per bulk-enqueued row.
* ``job_terminal_has_finished_at``: state only. The model now lists the
  terminal states sorted (a frozenset's order follows the hash seed); the
  SQL check is the same, so the table is not rescanned.
* PostgreSQL only: a statement-level trigger on ``controlplane_jobevent`` sends
  ``NOTIFY controlplane_events`` once per inserting statement, so the
  dashboard relay can LISTEN instead of polling. SQLite has no NOTIFY.
"""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

NOTIFY_CHANNEL = "controlplane_events"

CREATE_NOTIFY = f"""
CREATE OR REPLACE FUNCTION controlplane_jobevent_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{NOTIFY_CHANNEL}', '');
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS controlplane_jobevent_notify ON controlplane_jobevent;
CREATE TRIGGER controlplane_jobevent_notify AFTER INSERT ON controlplane_jobevent
FOR EACH STATEMENT EXECUTE FUNCTION controlplane_jobevent_notify();
"""

DROP_NOTIFY = """
DROP TRIGGER IF EXISTS controlplane_jobevent_notify ON controlplane_jobevent;
DROP FUNCTION IF EXISTS controlplane_jobevent_notify();
"""


def _postgresql_only(sql: str):
    """A RunPython callable that runs ``sql`` on PostgreSQL and does nothing elsewhere."""

    def run(apps, schema_editor) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


TERMINAL_SORTED = ["cancelled", "failed", "succeeded"]


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="OperatorAction",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                ("username", models.CharField(blank=True, default="", max_length=150)),
                ("action", models.CharField(max_length=50)),
                ("target", models.CharField(blank=True, default="", max_length=255)),
                ("filter", models.JSONField(blank=True, default=dict)),
                ("count", models.IntegerField(default=0)),
                ("reason", models.TextField(blank=True, default="")),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={"ordering": ["-at", "-id"]},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="job_terminal_has_finished_at"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("status__in", TERMINAL_SORTED), _negated=True),
                            ("finished_at__isnull", False),
                            _connector="OR",
                        ),
                        name="job_terminal_has_finished_at",
                    ),
                ),
            ],
        ),
        migrations.RemoveIndex(model_name="job", name="job_parent_idx"),
        migrations.RemoveIndex(model_name="job", name="job_finished_idx"),
        migrations.RemoveIndex(model_name="job", name="job_worker_idx"),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent", "status"],
                name="job_parent_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["status", "finished_at"],
                name="job_finished_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["worker"],
                name="job_worker_idx",
            ),
        ),
        migrations.RunPython(
            _postgresql_only(CREATE_NOTIFY), _postgresql_only(DROP_NOTIFY), elidable=False
        ),
    ]
