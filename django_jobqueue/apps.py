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
        if _uses_our_tasks_backend():
            autodiscover_modules("tasks")  # @task functions register as they are defined


def _uses_our_tasks_backend() -> bool:
    """Whether settings.TASKS names JobQueueBackend (then tasks.py modules are discovered)."""
    from django.conf import settings

    backends = getattr(settings, "TASKS", {}) or {}
    return any(
        str(config.get("BACKEND", "")) == "django_jobqueue.backends.JobQueueBackend"
        for config in backends.values()
    )
