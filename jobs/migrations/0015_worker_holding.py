"""A worker's hold-off from its ``pre_dequeue`` (workers.holding): until when, and why."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0014_retry_policy_and_retention")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="holding_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="worker",
            name="holding_reason",
            field=models.TextField(blank=True, default=""),
        ),
    ]
