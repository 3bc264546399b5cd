# The job's two nullable references get partial indexes (over the rows that have one) in
# place of Django's plain foreign-key indexes: see Job.Meta.indexes. The new indexes come
# first, so that MySQL/MariaDB always have an index for each foreign key (they refuse to
# drop the only one).

import django.db.models.deletion
import django_jobqueue.dialects.indexes
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0011_minute_metrics'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=django_jobqueue.dialects.indexes.PartialIndex(fields=['parent'], name='jobqueue_job_parent', where=models.Q(('parent__isnull', False))),
        ),
        migrations.AddIndex(
            model_name='job',
            index=django_jobqueue.dialects.indexes.PartialIndex(fields=['cancelled_by'], name='jobqueue_job_cancelled_by', where=models.Q(('cancelled_by__isnull', False))),
        ),
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
    ]
