"""An index for the admin's search inside arguments (`args.tenant_id=42`), on PostgreSQL.

A GIN index of the arguments (`jsonb_path_ops`): a search adds a containment test
(`args @> '{"tenant_id": 42}'`) that the index answers, beside the exact test. Built
CONCURRENTLY, so that a table of millions of jobs keeps taking writes while it is built
(hence a migration that is not atomic). MySQL, MariaDB and SQLite have no index for any key
of a JSON document: there the search reads the rows.
"""

from django.db import migrations

INDEX = "jobqueue_job_args_gin"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_jobqueue", "Job")._meta.db_table)
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {table} USING gin (args jsonb_path_ops)"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_jobqueue", "0024_job_action_permissions"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
