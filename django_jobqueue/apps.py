"""App configuration: autodiscover jobs.py modules and register the system checks."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules
from django.utils.translation import gettext_lazy as _


class JobQueueConfig(AppConfig):
    name = "django_jobqueue"
    verbose_name = _("Job queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the checks

        autodiscover_modules("jobs")
