"""The Schedules page: each schedule of JOBQUEUE["SCHEDULES"] (and of @jobqueue.schedule) and
each stored as a row, when it runs, its next slots ("in 20 s"), the last one a worker enqueued
and the outcome of its last job, as `jobqueue_schedules` lists them.

Its own actions, each under a permission of its own: pause and resume any schedule
(`django_jobqueue.pause_schedule`), run any schedule now (`django_jobqueue.run_schedule`).
Stored schedules are added, changed and deleted through the forms of `ScheduleDefinition`
(its add, change and delete permissions); those of the settings are read-only here.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from .. import conf, schedule_rows
from ..dialects import get_dialect
from ..exceptions import ScheduleError
from ..models import ScheduleDefinition, ScheduleState
from . import display
from .actions import logger
from .pages import OnePageAdmin

NEXT_SLOTS = 3  # the next slots the page shows for each schedule
PAUSE = "pause_schedule"
RUN = "run_schedule"
# The page's actions: the permission each needs.
ACTIONS = {"pause": PAUSE, "resume": PAUSE, "run": RUN}


def allowed(request: HttpRequest, permission: str) -> bool:
    """Whether the user holds `django_jobqueue.<permission>`."""
    return bool(request.user.has_perm(f"django_jobqueue.{permission}"))


def definition_url(action: str, name: str | None = None) -> str:
    """The admin page that adds (`add`), changes or deletes stored schedule `name`."""
    args = [] if name is None else [name]
    return reverse(f"admin:django_jobqueue_scheduledefinition_{action}", args=args)


@admin.register(ScheduleState)
class ScheduleAdmin(OnePageAdmin):
    """One page instead of a list of state rows: every schedule and where it stands."""

    title = "Schedules"
    template = "admin/django_jobqueue/schedules.html"

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            action = request.POST.get("action", "")
            permitted = action in ACTIONS and allowed(request, ACTIONS[action])
            if not permitted or not self.has_view_permission(request):
                raise PermissionDenied
            self._act(request, action, request.POST.get("name", ""))
            return HttpResponseRedirect(self.page_url())
        return super().changelist_view(request, extra_context)

    def _act(self, request: HttpRequest, action: str, name: str) -> None:
        try:
            if action == "run":
                job = schedule_rows.run_now(name)
                done = f"Enqueued job #{job.pk} of schedule {name!r} now (its slots go on)."
            elif action == "pause":
                done = (
                    f"Paused schedule {name!r}: its slots are not enqueued until it is resumed."
                    if schedule_rows.pause(name)
                    else f"Schedule {name!r} was paused already."
                )
            else:
                done = (
                    f"Resumed schedule {name!r}: its next slot runs, the missed ones do not."
                    if schedule_rows.resume(name)
                    else f"Schedule {name!r} was not paused."
                )
        except ScheduleError as exc:
            messages.error(request, f"Nothing was done: {exc}")
            return
        state = ScheduleState.objects.filter(name=name).first()
        if state is not None:
            self.log_change(request, state, f"{action.capitalize()} schedule")
        logger.info("Admin user %s: %s schedule %r", request.user.get_username(), action, name)
        messages.success(request, done)

    def page_context(self, request: HttpRequest) -> dict[str, Any]:
        dialect = get_dialect(conf.get().database)
        can = {
            "can_pause": allowed(request, PAUSE),
            "can_run": allowed(request, RUN),
            "can_add": request.user.has_perm("django_jobqueue.add_scheduledefinition"),
            "add_url": definition_url("add"),
        }
        change = request.user.has_perm("django_jobqueue.change_scheduledefinition")
        broken = [
            {"name": name, "problem": problem, "url": definition_url("change", name)}
            for name, problem in schedule_rows.stored(dialect.using).problems.items()
        ]
        try:
            found = schedule_rows.standings(dialect, NEXT_SLOTS)
        except ImproperlyConfigured as exc:  # the system checks say so too (E010)
            return {"rows": [], "problem": str(exc), "broken": broken, **can}
        rows = [row(standing, change) for standing in found]
        return {"rows": rows, "problem": "", "broken": broken, **can}


def row(standing: schedule_rows.Standing, change: bool) -> dict[str, Any]:
    """What the page shows of one schedule besides its definition."""
    now = standing.now
    assert now is not None
    name = standing.schedule.name
    return {
        "standing": standing,
        "next": [(slot, display.relative(slot, now)) for slot in standing.next_slots],
        "last_ago": display.relative(standing.last_enqueued, now),
        "job_url": "" if standing.last_job_id is None else display.job_url(standing.last_job_id),
        "run_ago": display.relative(standing.run_at, now),
        "outcome": ""
        if standing.outcome_job_id is None or standing.outcome is None
        else display.job_link(standing.outcome_job_id, standing.outcome),
        "edit_url": definition_url("change", name) if standing.stored and change else "",
    }


class ScheduleDefinitionForm(forms.ModelForm):  # type: ignore[type-arg]
    """A stored schedule, checked as a JOBQUEUE["SCHEDULES"] entry is (`schedules.parse`)."""

    class Meta:
        model = ScheduleDefinition
        fields = list(("name", *schedule_rows.KEYS))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        name = self.instance.name if self.instance.pk else data.get("name")
        if self.errors or not name:
            return data
        try:
            schedule_rows.check(name, schedule_rows.raw_of(data))
        except ScheduleError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(ScheduleDefinition)
class ScheduleDefinitionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The add, change and delete forms of stored schedules; their list is the Schedules page
    (this model is not listed in the admin's index on its own)."""

    form = ScheduleDefinitionForm
    fieldsets = [
        (None, {"fields": ["name", "handler", "task"]}),
        ("When", {"fields": ["cron", "timezone", "every", "catch_up", "grace"]}),
        (
            "Its jobs",
            {"fields": ["args", "queue", "group", "priority", "uses", "sequence"]},
        ),
        (None, {"fields": ["sequence_on_failure"]}),
    ]
    actions = None

    class Media:
        css = {"all": [display.STYLESHEET]}

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        return {}  # reached from the Schedules page

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["name"] if obj is not None else []

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return self._to_page()

    def _to_page(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:django_jobqueue_schedulestate_changelist"))

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # Where it stands is written with it (schedule_rows.add), and a change keeps it.
        raw = schedule_rows.raw_of(form.cleaned_data)
        schedule_rows.add(obj.name, raw, replace=change)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        schedule_rows.remove(obj.name)

    def response_post_save_add(self, request: HttpRequest, obj: Any) -> HttpResponseRedirect:
        return self._to_page()

    def response_post_save_change(self, request: HttpRequest, obj: Any) -> HttpResponseRedirect:
        return self._to_page()
