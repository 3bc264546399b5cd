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
        from django.test.signals import setting_changed

        from . import checks, telemetry  # noqa: F401 - checks: registers the checks

        telemetry.configure()  # imports nothing of OpenTelemetry unless it is turned on
        setting_changed.connect(telemetry.on_setting_changed, dispatch_uid="jobqueue-telemetry")
        autodiscover_modules("jobs")
        if _uses_our_tasks_backend():
            autodiscover_modules("tasks")  # @task functions register as they are defined


def _uses_our_tasks_backend() -> bool:
    """Whether settings.TASKS names JobQueueBackend (then tasks.py modules are discovered)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    from . import backends

    configured = getattr(settings, "TASKS", {}) or {}
    for config in configured.values():
        path = str(config.get("BACKEND", ""))
        if path == "django_jobqueue.backends.JobQueueBackend":
            return True
        # A project's subclass of JobQueueBackend is ours too: without discovery its worker
        # processes would have no handler for any task and mark every task job dead.
        if not backends.HAS_TASKS:
            continue
        try:
            backend_class = import_string(path)
        except ImportError:
            continue  # Django reports a backend it cannot import when the backend is used
        if isinstance(backend_class, type) and issubclass(backend_class, backends.JobQueueBackend):
            return True
    return False
