"""Unique jobs: ``idempotency_key`` becomes ``unique_key`` with a ``unique_while`` mode.

Existing keys keep their meaning: they are held until retention. One partial
unique index (``job_unique_key_held``) replaces the old one; its condition
is ``jobs.uniqueness.HOLDS_KEY``.
"""

from django.db import migrations, models


def keys_held_until_retention(apps, schema_editor):
    """Every key stored before this migration was an idempotency key."""
    Job = apps.get_model("controlplane", "Job")
    db = schema_editor.connection.alias
    Job.objects.using(db).filter(unique_key__isnull=False).update(unique_while="until_retention")


def only_idempotency_keys(apps, schema_editor):
    """Going back: the old index holds every key for ever, so only those keys can stay."""
    Job = apps.get_model("controlplane", "Job")
    db = schema_editor.connection.alias
    Job.objects.using(db).filter(unique_key__isnull=False).exclude(
        unique_while="until_retention"
    ).update(unique_key=None)


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0007_schedules_timeouts_rate_limits"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="job",
            name="job_idempotency_key_unique",
        ),
        migrations.RenameField(
            model_name="job",
            old_name="idempotency_key",
            new_name="unique_key",
        ),
        migrations.AddField(
            model_name="job",
            name="unique_while",
            field=models.CharField(
                blank=True,
                choices=[
                    ("queued", "Until it first starts"),
                    ("active", "While queued or running"),
                    ("until_retention", "Until retention deletes it"),
                ],
                max_length=16,
                null=True,
            ),
        ),
        migrations.RunPython(keys_held_until_retention, only_idempotency_keys, elidable=True),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("unique_key__isnull", True), ("unique_while__isnull", True)),
                    models.Q(
                        ("unique_key__isnull", False),
                        ("unique_while__in", ["queued", "active", "until_retention"]),
                    ),
                    _connector="OR",
                ),
                name="job_unique_while_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("unique_while", "until_retention"),
                    models.Q(("status__in", ["queued", "running"]), ("unique_while", "active")),
                    models.Q(
                        ("started_at__isnull", True),
                        ("status", "queued"),
                        ("unique_while", "queued"),
                    ),
                    _connector="OR",
                ),
                fields=("unique_key",),
                name="job_unique_key_held",
            ),
        ),
    ]
