"""One limits engine: the group, queue and dynamic caps and the group rates become resources.

GROUP_LIMITS, QUEUE_LIMITS, RATE_LIMITS and DYNAMIC_LIMIT were served by their own tables: a
lock row per limit (ConcurrencyLimit, "group:<name>", "queue:<name>", "dynamic") and the
group rates' starts (RateLimitStart). They are now resources of the LIMITS engine, with its
lock rows (Limit) and its one window (ResourceStart): the rows move there, and the old tables
go. The "dynamic" row has no successor (each group's cap locks its group's row).
"""

from django.db import migrations


def move(apps, schema_editor):
    alias = schema_editor.connection.alias
    ConcurrencyLimit = apps.get_model("django_jobqueue", "ConcurrencyLimit")
    RateLimitStart = apps.get_model("django_jobqueue", "RateLimitStart")
    Limit = apps.get_model("django_jobqueue", "Limit")
    ResourceStart = apps.get_model("django_jobqueue", "ResourceStart")
    keys = ConcurrencyLimit.objects.using(alias).exclude(key="dynamic").values_list("key", flat=True)
    Limit.objects.using(alias).bulk_create(
        [Limit(name=key) for key in keys], ignore_conflicts=True, batch_size=500
    )
    ResourceStart.objects.using(alias).bulk_create(
        (
            ResourceStart(resource=f"group:{group}", started_at=at, units=count)
            for group, at, count in RateLimitStart.objects.using(alias)
            .values_list("group_key", "started_at", "count")
            .iterator()
        ),
        batch_size=500,
    )


def move_back(apps, schema_editor):
    alias = schema_editor.connection.alias
    ConcurrencyLimit = apps.get_model("django_jobqueue", "ConcurrencyLimit")
    RateLimitStart = apps.get_model("django_jobqueue", "RateLimitStart")
    Limit = apps.get_model("django_jobqueue", "Limit")
    ResourceStart = apps.get_model("django_jobqueue", "ResourceStart")
    names = Limit.objects.using(alias).filter(name__regex=r"^(group|queue):")
    ConcurrencyLimit.objects.using(alias).bulk_create(
        [ConcurrencyLimit(key=name) for name in names.values_list("name", flat=True)],
        ignore_conflicts=True,
        batch_size=500,
    )
    starts = ResourceStart.objects.using(alias).filter(resource__startswith="group:")
    RateLimitStart.objects.using(alias).bulk_create(
        (
            RateLimitStart(group_key=resource[len("group:") :], started_at=at, count=units)
            for resource, at, units in starts.values_list("resource", "started_at", "units")
            if len(resource) <= len("group:") + 200
        ),
        batch_size=500,
    )
    starts.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobqueue", "0014_schedule_verbose_names"),
    ]

    operations = [
        migrations.RunPython(move, move_back, elidable=True),
        migrations.DeleteModel(
            name="ConcurrencyLimit",
        ),
        migrations.RemoveIndex(
            model_name="ratelimitstart",
            name="jobqueue_rate_group_started",
        ),
        migrations.DeleteModel(
            name="RateLimitStart",
        ),
    ]
