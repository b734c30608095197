"""Metrics: quarter-hour and hourly sums of the per-minute rollup, for the
dashboard's charts of a day and more (jobs.metrics.spans)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0011_job_trace_context"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricSpan",
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
                ("span_seconds", models.PositiveIntegerField()),
                ("start", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("span_seconds", "start", "queue", "operation"),
                        name="metricspan_unique",
                    )
                ],
            },
        ),
    ]
