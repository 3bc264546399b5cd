"""The ready-set index, per database: see django_jobqueue.models.indexes.ReadyIndex.

PostgreSQL and SQLite get a partial index over `ready` rows only, so the claim scan stays
proportional to the ready set however many finished rows the table holds. MySQL and MariaDB
have no partial indexes: they get a composite index led by `state` instead. The index is part
of the migration state, so SQLite's table rebuilds in later migrations recreate it.
"""

from django.db import migrations

from django_jobqueue.models.indexes import ReadyIndex


class Migration(migrations.Migration):
    dependencies = [("django_jobqueue", "0001_initial")]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=ReadyIndex(fields=["-priority", "id"], name="jobqueue_job_ready"),
        ),
    ]
