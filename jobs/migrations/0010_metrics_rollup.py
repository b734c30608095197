"""Metrics: the reaper's per-minute rollup, all-time totals and its event watermark."""

from django.db import migrations, models

# GET /metrics reports jobs per (queue, state) past COUNT_CAP from PostgreSQL's
# estimate; queue and state are correlated (a busy queue is mostly succeeded
# jobs), so without these statistics the estimate is off by several times.
STATISTICS = "job_queue_status_stats"


def create_statistics(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("controlplane", "Job")._meta.db_table)
    schema_editor.execute(
        f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} (mcv) ON queue, status FROM {table}"
    )


def drop_statistics(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0009_schedulefire_job_index"),
    ]

    operations = [
        migrations.RunPython(create_statistics, drop_statistics),
        migrations.CreateModel(
            name="MetricCursor",
            fields=[
                ("name", models.CharField(max_length=50, primary_key=True, serialize=False)),
                ("last_event_id", models.BigIntegerField(default=0)),
                ("rolled_up_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name="MetricRollup",
            fields=[
                ("queue", models.CharField(max_length=200)),
                ("operation", models.CharField(max_length=200)),
                ("started", models.BigIntegerField(default=0)),
                ("succeeded", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("retried", models.BigIntegerField(default=0)),
                ("cancelled", models.BigIntegerField(default=0)),
                ("lease_expiries", models.BigIntegerField(default=0)),
                ("rescues", models.BigIntegerField(default=0)),
                ("wait_bucket_counts", models.JSONField(blank=True, default=list)),
                ("wait_sum", models.FloatField(default=0.0)),
                ("run_bucket_counts", models.JSONField(blank=True, default=list)),
                ("run_sum", models.FloatField(default=0.0)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("minute", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("minute", "queue", "operation"), name="metricrollup_minute_unique"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="MetricTotal",
            fields=[
                ("queue", models.CharField(max_length=200)),
                ("operation", models.CharField(max_length=200)),
                ("started", models.BigIntegerField(default=0)),
                ("succeeded", models.BigIntegerField(default=0)),
                ("failed", models.BigIntegerField(default=0)),
                ("retried", models.BigIntegerField(default=0)),
                ("cancelled", models.BigIntegerField(default=0)),
                ("lease_expiries", models.BigIntegerField(default=0)),
                ("rescues", models.BigIntegerField(default=0)),
                ("wait_bucket_counts", models.JSONField(blank=True, default=list)),
                ("wait_sum", models.FloatField(default=0.0)),
                ("run_bucket_counts", models.JSONField(blank=True, default=list)),
                ("run_sum", models.FloatField(default=0.0)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "operation"), name="metrictotal_unique"
                    )
                ],
            },
        ),
    ]
