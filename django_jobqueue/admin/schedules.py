"""The Schedules page: each schedule of JOBQUEUE["SCHEDULES"] (and of @jobqueue.schedule),
when it runs, its next slots and the last one a worker enqueued, as `jobqueue_schedules`
lists them. Read-only: schedules are written in the code and the settings."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from .. import conf, schedules
from ..dialects import get_dialect
from ..models import ScheduleState
from . import display
from .pages import OnePageAdmin

NEXT_SLOTS = 3  # the next slots the page shows for each schedule


@admin.register(ScheduleState)
class ScheduleAdmin(OnePageAdmin):
    """One page instead of a list of state rows: every schedule and where it stands."""

    title = "Schedules"
    template = "admin/django_jobqueue/schedules.html"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def page_context(self, request: HttpRequest) -> dict[str, Any]:
        dialect = get_dialect(conf.get().database)
        try:
            found = schedules.standings(dialect, NEXT_SLOTS)
        except ImproperlyConfigured as exc:  # the system checks say so too (E010)
            return {"rows": [], "problem": str(exc)}
        rows = [
            {
                "standing": standing,
                "job_url": ""
                if standing.last_job_id is None
                else display.job_url(standing.last_job_id),
            }
            for standing in found
        ]
        return {"rows": rows, "problem": ""}
