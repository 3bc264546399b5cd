"""Durable jobs: step records, events and event waits, spawned children, progress."""

import django.db.models.deletion
import django_jobqueue.models.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0008_exact_keys_first_started_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='has_children',
            field=models.BooleanField(default=False, editable=False, verbose_name='has children'),
        ),
        migrations.AddField(
            model_name='job',
            name='has_steps',
            field=models.BooleanField(default=False, editable=False, verbose_name='has steps'),
        ),
        migrations.AddField(
            model_name='job',
            name='progress',
            field=models.JSONField(blank=True, null=True, verbose_name='progress'),
        ),
        migrations.AddField(
            model_name='jobdependency',
            name='awaits',
            field=models.BooleanField(default=False, verbose_name='awaits'),
        ),
        migrations.CreateModel(
            name='JobEvent',
            fields=[
                ('key', django_jobqueue.models.fields.KeyField(max_length=255, primary_key=True, serialize=False, verbose_name='key')),
                ('payload', models.JSONField(blank=True, null=True, verbose_name='payload')),
                ('sent_at', models.DateTimeField(blank=True, null=True, verbose_name='sent')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='created')),
            ],
            options={
                'verbose_name': 'job event',
                'verbose_name_plural': 'job events',
                'indexes': [models.Index(fields=['sent_at'], name='jobqueue_event_sent')],
            },
        ),
        migrations.CreateModel(
            name='JobWait',
            fields=[
                ('job', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='django_jobqueue.job')),
                ('key', django_jobqueue.models.fields.KeyField(max_length=255, verbose_name='event key')),
                ('until', models.DateTimeField(blank=True, null=True, verbose_name='until')),
            ],
            options={
                'verbose_name': 'job wait',
                'verbose_name_plural': 'job waits',
                'indexes': [models.Index(fields=['key'], name='jobqueue_wait_key'), models.Index(fields=['until'], name='jobqueue_wait_until')],
            },
        ),
        migrations.CreateModel(
            name='JobStep',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', django_jobqueue.models.fields.KeyField(max_length=200, verbose_name='name')),
                ('seq', models.IntegerField(default=1, verbose_name='call')),
                ('result', models.JSONField(blank=True, null=True, verbose_name='result')),
                ('attempt', models.IntegerField(verbose_name='attempt')),
                ('duration', models.FloatField(blank=True, null=True, verbose_name='duration (seconds)')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='recorded')),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='django_jobqueue.job')),
            ],
            options={
                'verbose_name': 'job step',
                'verbose_name_plural': 'job steps',
                'constraints': [models.UniqueConstraint(fields=('job', 'name', 'seq'), name='jobqueue_step_unique')],
            },
        ),
    ]
