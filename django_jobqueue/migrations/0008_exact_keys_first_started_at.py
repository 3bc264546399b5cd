"""Key columns compare exactly; Job.first_started_at for the start of a job's first attempt.

On MySQL/MariaDB the key columns (handler type, queue, group, unique key, lease owner, worker
id, limit, effect, schedule and paused-queue names) get a binary no-pad collation (MODIFY,
which keeps their indexes and constraints). On PostgreSQL and SQLite, whose comparisons are
exact already, only the new nullable column is added.
"""

from django_jobqueue.models.fields import AlterKeyField, KeyField
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0007_schedules_rate_limits_pause'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='first_started_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='first started'),
        ),
        AlterKeyField(
            model_name='concurrencylimit',
            name='key',
            field=KeyField(max_length=255, primary_key=True, serialize=False, verbose_name='limit'),
        ),
        AlterKeyField(
            model_name='effect',
            name='key',
            field=KeyField(max_length=255, unique=True, verbose_name='key'),
        ),
        AlterKeyField(
            model_name='job',
            name='group_key',
            field=KeyField(blank=True, default='', max_length=200, verbose_name='group'),
        ),
        AlterKeyField(
            model_name='job',
            name='lease_owner',
            field=KeyField(blank=True, max_length=255, null=True, verbose_name='lease owner'),
        ),
        AlterKeyField(
            model_name='job',
            name='queue',
            field=KeyField(default='default', max_length=100, verbose_name='queue'),
        ),
        AlterKeyField(
            model_name='job',
            name='type',
            field=KeyField(max_length=200, verbose_name='handler key'),
        ),
        AlterKeyField(
            model_name='job',
            name='unique_key',
            field=KeyField(blank=True, max_length=255, null=True, verbose_name='unique key'),
        ),
        AlterKeyField(
            model_name='queuestate',
            name='name',
            field=KeyField(max_length=100, primary_key=True, serialize=False, verbose_name='queue'),
        ),
        AlterKeyField(
            model_name='ratelimitstart',
            name='group_key',
            field=KeyField(max_length=200, verbose_name='group'),
        ),
        AlterKeyField(
            model_name='schedulestate',
            name='name',
            field=KeyField(max_length=200, primary_key=True, serialize=False, verbose_name='schedule'),
        ),
        AlterKeyField(
            model_name='worker',
            name='id',
            field=KeyField(max_length=255, primary_key=True, serialize=False, verbose_name='worker id'),
        ),
    ]
