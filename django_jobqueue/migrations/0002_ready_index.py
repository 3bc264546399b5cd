"""The ready-set index, per database.

PostgreSQL and SQLite get a partial index over `ready` rows only, so the claim scan stays
proportional to the ready set however many finished rows the table holds. MySQL and MariaDB
have no partial indexes: they get a composite index led by `state` instead.
"""

from django.db import migrations

TABLE = "django_jobqueue_job"
INDEX = "jobqueue_job_ready"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        sql = f"CREATE INDEX {INDEX} ON {TABLE} (state, priority DESC, id)"
    else:
        sql = f"CREATE INDEX {INDEX} ON {TABLE} (priority DESC, id) WHERE state = 'ready'"
    schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        schema_editor.execute(f"DROP INDEX {INDEX} ON {TABLE}")
    else:
        schema_editor.execute(f"DROP INDEX {INDEX}")


class Migration(migrations.Migration):
    dependencies = [("django_jobqueue", "0001_initial")]

    operations = [migrations.RunPython(create, drop, atomic=False, elidable=False)]
