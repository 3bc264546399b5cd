from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobqueue", "0018_wait_count"),
    ]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="process_key",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=255, verbose_name="process"
            ),
        ),
    ]
