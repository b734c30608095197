"""``RemoteOperation.last_seen_at``: when a worker declaring it was last known alive.

Declared operations stay enqueueable for ``REMOTE_OPERATION_GRACE_SECONDS``
after that moment (``jobs.remote_operations``). Rows without one count from
their ``updated_at``, the last time a registration touched them.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0005_worker_liveness_lock")]

    operations = [
        migrations.AddField(
            model_name="remoteoperation",
            name="last_seen_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
