"""Limits built for quotas: the resources a job uses, their lock rows, live changes, rate windows."""

import django_jobqueue.models.fields
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0009_durable_jobs'),
    ]

    operations = [
        migrations.CreateModel(
            name='Limit',
            fields=[
                ('name', django_jobqueue.models.fields.KeyField(max_length=255, primary_key=True, serialize=False, verbose_name='resource')),
                ('closed_until', models.DateTimeField(blank=True, null=True, verbose_name='closed until')),
                ('created_at', models.DateTimeField(auto_now_add=True, verbose_name='first used')),
            ],
            options={
                'verbose_name': 'limit',
                'verbose_name_plural': 'limits',
            },
        ),
        migrations.CreateModel(
            name='LimitSetting',
            fields=[
                ('name', django_jobqueue.models.fields.KeyField(max_length=255, primary_key=True, serialize=False, verbose_name='limit')),
                ('concurrency', models.IntegerField(blank=True, null=True, verbose_name='concurrency')),
                ('rate', models.CharField(blank=True, default='', max_length=40, verbose_name='rate')),
                ('updated_at', models.DateTimeField(auto_now=True, verbose_name='changed')),
            ],
            options={
                'verbose_name': 'limit setting',
                'verbose_name_plural': 'limit settings',
            },
        ),
        migrations.AddField(
            model_name='job',
            name='uses',
            field=models.JSONField(blank=True, null=True, verbose_name='uses'),
        ),
        migrations.CreateModel(
            name='ResourceStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('resource', django_jobqueue.models.fields.KeyField(max_length=255, verbose_name='resource')),
                ('started_at', models.DateTimeField(verbose_name='started')),
                ('units', models.IntegerField(verbose_name='units')),
            ],
            options={
                'verbose_name': 'resource start',
                'verbose_name_plural': 'resource starts',
                'indexes': [models.Index(fields=['resource', 'started_at'], name='jobqueue_resource_started')],
            },
        ),
    ]
