"""Permissions of the admin's enqueue form and a job page's "run again" (issue 51)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('django_jobqueue', '0025_args_search_index'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='job',
            options={'permissions': [('send_event', 'Can send an event to a job that waits for one'), ('run_now', 'Can make a scheduled job due now'), ('enqueue_job', 'Can enqueue a job from the admin'), ('run_again', 'Can enqueue a job again with its arguments')], 'verbose_name': 'job', 'verbose_name_plural': 'jobs'},
        ),
    ]
