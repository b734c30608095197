from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("controlplane", "0004_claimable_ids_function")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="liveness_lock",
            field=models.BooleanField(default=False),
        ),
    ]
