"""Worker.metrics: whether a worker records OpenTelemetry metrics (issue 52). The queue gauges
are read by the live worker with the smallest id among those that do."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobqueue", "0029_pause_resources_workflows"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="metrics",
            field=models.BooleanField(db_default=False, default=False, verbose_name="records metrics"),
        ),
    ]
