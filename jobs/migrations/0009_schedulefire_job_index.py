"""The fires of a job, for retention: deleting old jobs clears ``ScheduleFire.job`` by job id."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("controlplane", "0008_unique_jobs"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="schedulefire",
            index=models.Index(
                condition=models.Q(("job__isnull", False)),
                fields=["job"],
                name="schedulefire_job_idx",
            ),
        ),
    ]
