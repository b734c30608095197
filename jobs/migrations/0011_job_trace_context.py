"""Tracing: the enqueuer's OpenTelemetry context, stored with each job (jobs.tracing)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0010_metrics_rollup"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
