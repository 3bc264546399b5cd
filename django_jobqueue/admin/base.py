"""What every job page of the admin shares: Job's permissions, a read-only form, fast lists."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import pausing
from ..models import Job
from . import bulk, display, filters, rollup
from .actions import JobActionForm
from .paging import capped_paginator

# Lists never load these: they can be large, and a page of them is a page of documents.
JSON_COLUMNS = ("args", "result", "errors", "worker_ids", "last_error")


class OwnFiltersAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A list that accepts from the URL only the parameters of its own list filters.

    Django's default lets any staff user filter by any column with any lookup: a regular
    expression over the arguments (which can freeze an SQLite-backed site), a text scan of
    every error. Every filter here is a SimpleListFilter (choices without a scan), and the
    links the admin draws (?state=, ?queue=, ?container=, ?worker=, ...) are its parameters;
    search (?q=), paging and ordering are not lookups and stay as they are.
    """

    class Media:
        css = {"all": [display.STYLESHEET]}  # classes, not inline styles: a strict CSP allows them

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in filter_parameters(self.get_list_filter(request))

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if not filters.searchable(object_id):  # PostgreSQL refuses NUL in any parameter
            return None
        return super().get_object(request, object_id, from_field)


def filter_parameters(list_filter: Any) -> set[str]:
    """The URL parameters of the SimpleListFilter classes in `list_filter`."""
    return {
        str(entry.parameter_name)
        for entry in list_filter
        if isinstance(entry, type) and issubclass(entry, admin.SimpleListFilter)
    }


class JobPagesAdmin(OwnFiltersAdmin):
    """A page of jobs, guarded by Job's own permissions (also on the proxy models' pages).

    Nobody adds or edits rows here: the change permission allows the actions (retry, cancel,
    release a lease), the delete permission the bounded delete action, and a job's page is
    read-only for everyone.
    """

    action_form = JobActionForm
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts are a COUNT per filter choice
    list_per_page = 50
    sortable_by = ()
    list_display_links = None

    def select_all_response(
        self, name: str, request: HttpRequest, queryset: QuerySet[Any], options: dict[str, Any]
    ) -> HttpResponse | None:
        """What action `name` answers when "select all" chose the whole filtered list: its
        confirmation, or its hand-over to a job of the queue (bulk.py); None to run it in the
        request (`actions` calls this, and so never imports `bulk`)."""
        return bulk.by_filter(name, self, request, queryset, options)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        title = str(self.model._meta.verbose_name_plural).capitalize()
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def _can(self, request: HttpRequest, action: str) -> bool:
        return bool(request.user.has_perm(f"django_jobqueue.{action}_job"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._can(request, "view") or self._can(request, "change")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and self._can(request, "change")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Never Django's own delete (unbounded, and blind to what still needs a job): the
        # delete permission allows delete_finished_jobs instead.
        return False

    def has_delete_finished_permission(self, request: HttpRequest) -> bool:
        """Whether the user may run delete_finished_jobs: Job's delete permission."""
        return self._can(request, "delete")

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if from_field is None and filters.parse_id(object_id) is None:
            return None  # a number too large for the column would fail in the driver
        return super().get_object(request, object_id, from_field)

    def response_action(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """Run an action on those selected values that can name a job; ignore forged ones."""
        picked = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ids = [value for value in picked if filters.parse_id(value) is not None]
        if ids != picked:
            post = request.POST.copy()
            post.setlist(helpers.ACTION_CHECKBOX_NAME, ids)
            request.POST = post  # type: ignore[assignment]
        return super().response_action(request, *args, **kwargs)

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any
    ) -> Any:
        return capped_paginator(request, queryset, per_page)

    def list_queryset(self, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """The list's rows: JSON columns deferred, the last error's type and message only."""
        return queryset.defer(*JSON_COLUMNS).annotate(
            error_type=KT("last_error__type"), error_message=KT("last_error__message")
        )

    @admin.display(description="job")
    def job(self, job: Job) -> SafeString:
        return display.job_link(int(job.pk))

    @admin.display(description="state")
    def state_badge(self, job: Job) -> SafeString:
        rolled = getattr(job, "rollup", None)  # a workflow's children (get_changelist_instance)
        shown = display.badge(job.state)
        if rolled is not None:
            shown = format_html("{}{}", shown, rollup.badge_note(rolled))
        # Set for a list's page at once (get_changelist_instance); read here on a job's page.
        if hasattr(job, "paused_why"):
            why = job.paused_why
        else:
            why = pausing.reasons([job], job._state.db).get(int(job.pk)) if job.pk else None
        return format_html("{}{}", shown, display.paused_note(why)) if why else shown

    @admin.display(description="progress")
    def progress_bar(self, job: Job) -> SafeString | str:
        # Only while it runs: a finished or waiting job keeps its last attempt's progress.
        if job.state != Job.State.RUNNING or not job.progress:
            return ""
        return display.progress_bar(job.progress)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The list, with the children of the workflows on its page counted (one query)."""
        changelist = super().get_changelist_instance(request)
        rollup.annotate_page(changelist.result_list)
        held = pausing.reasons(changelist.result_list)
        for job in changelist.result_list:
            job.paused_why = held.get(job.pk)
        return changelist

    @admin.display(description="attempts")
    def attempts_of(self, job: Job) -> str:
        return f"{job.attempts} of {job.max_attempts}"

    created = display.moment_column("created_at", "created")
    finished = display.moment_column("finished_at", "finished")

    @admin.display(description="last error")
    def last_error_line(self, job: Job) -> SafeString | str:
        kind = getattr(job, "error_type", None)
        if kind is None:
            return ""
        error = {"type": kind, "message": getattr(job, "error_message", "")}
        line = display.first_line(error, limit=80)
        if job.state == Job.State.DONE:  # the job succeeded after it: not its outcome
            return format_html('<span class="jq-earlier">earlier attempt: {}</span>', line)
        return line

    @admin.display(description="queue / group")
    def queue_and_group(self, job: Job) -> SafeString:
        if not job.group_key:
            return format_html("{}", job.queue)
        return format_html('{}<span class="jq-sub">{}</span>', job.queue, job.group_key)

    @admin.display(description="run time")
    def run_time(self, job: Job) -> SafeString | str:
        """How long a running job has run, with its progress under it; how long a finished
        job's last attempt took (one column)."""
        if job.state == Job.State.RUNNING:
            took = self.running_for(job)
            bar = self.progress_bar(job)
            if took and bar:
                return format_html('{}<span class="jq-sub">{}</span>', took, bar)
            return took or bar
        if job.state in Job.TERMINAL_STATES and job.started_at and job.finished_at:
            seconds = (job.finished_at - job.started_at).total_seconds()
            return format_html(
                '<span class="jq-took" title="its last attempt">took {}</span>',
                display.duration(max(seconds, 0.0)),
            )
        return ""

    @admin.display(description="running for")
    def running_for(self, job: Job) -> SafeString | str:
        if job.state != Job.State.RUNNING or job.started_at is None:
            return ""
        return format_html(
            "{}", display.duration((timezone.now() - job.started_at).total_seconds())
        )
