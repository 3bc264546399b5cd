"""MinuteHandlerCount: each worker's per-minute counts per handler key (started, done, failed,
dead), written by its recorder, read by the admin overview's per-handler table instead of the
jobs that finished in the window (issue 51: the overview under 500 ms with a million jobs)."""

import django_jobqueue.models.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0030_worker_metrics'),
    ]

    operations = [
        migrations.CreateModel(
            name='MinuteHandlerCount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('minute', models.DateTimeField(verbose_name='minute')),
                ('worker', django_jobqueue.models.fields.KeyField(max_length=255, verbose_name='worker')),
                ('handler', django_jobqueue.models.fields.KeyField(max_length=200, verbose_name='handler')),
                ('started', models.IntegerField(default=0, verbose_name='started')),
                ('done', models.IntegerField(default=0, verbose_name='done')),
                ('failed', models.IntegerField(default=0, verbose_name='failed')),
                ('dead', models.IntegerField(default=0, verbose_name='dead')),
            ],
            options={
                'verbose_name': 'minute handler count',
                'verbose_name_plural': 'minute handler counts',
                'constraints': [models.UniqueConstraint(fields=('minute', 'worker', 'handler'), name='jobqueue_handler_minute')],
            },
        ),
    ]
