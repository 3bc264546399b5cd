# The job's two nullable references get partial indexes (over the rows that have one) in
# place of the plain indexes Django made for their foreign keys: see Job.Meta.indexes.
#
# A migration that only altered the fields (db_index=False) would make Django drop and re-add
# each foreign key (PostgreSQL re-checks every row under an exclusive lock; MySQL copies the
# table) and rebuild the table twice on SQLite. Here the fields change in Django's state only,
# and the database just gets the new index and loses the old one.

import django.db.models.deletion
import django_jobqueue.models.indexes
from django.db import migrations, models

REFERENCES = ("parent", "cancelled_by")


def _plain_indexes(schema_editor, model, column):
    """The names of the plain single-column indexes on `column` (Django's, or on MySQL the one
    the server made for the foreign key), the new partial ones left out."""
    with schema_editor.connection.cursor() as cursor:
        constraints = schema_editor.connection.introspection.get_constraints(
            cursor, model._meta.db_table
        )
    return [
        name
        for name, info in constraints.items()
        if info["columns"] == [column]
        and info["index"]
        and not info["primary_key"]
        and not info["unique"]
        and not name.startswith("jobqueue_job_")
    ]


def drop_plain_indexes(apps, schema_editor):
    model = apps.get_model("django_jobqueue", "Job")
    for field_name in REFERENCES:
        column = model._meta.get_field(field_name).column
        for name in _plain_indexes(schema_editor, model, column):
            schema_editor.execute(schema_editor._delete_index_sql(model, name))


def create_plain_indexes(apps, schema_editor):
    model = apps.get_model("django_jobqueue", "Job")
    for field_name in REFERENCES:
        field = model._meta.get_field(field_name)
        if schema_editor.connection.vendor == "mysql":
            continue  # the server keeps an index for each foreign key itself
        if not _plain_indexes(schema_editor, model, field.column):
            schema_editor.execute(schema_editor._create_index_sql(model, fields=[field]))


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0011_minute_metrics'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=django_jobqueue.models.indexes.PartialIndex(fields=['parent'], name='jobqueue_job_parent', where=models.Q(('parent__isnull', False))),
        ),
        migrations.AddIndex(
            model_name='job',
            index=django_jobqueue.models.indexes.PartialIndex(fields=['cancelled_by'], name='jobqueue_job_cancelled_by', where=models.Q(('cancelled_by__isnull', False))),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='job',
                    name='cancelled_by',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='django_jobqueue.job', verbose_name='cancelled because of'),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='parent',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='children', to='django_jobqueue.job', verbose_name='container'),
                ),
            ],
            database_operations=[
                migrations.RunPython(drop_plain_indexes, create_plain_indexes),
            ],
        ),
    ]
