"""The jobs list and the job page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from .. import conf, containers
from ..engine import control, sequences
from ..exceptions import JobQueueError
from ..models import Job, JobDependency, JobSequence, JobStep, Worker
from . import (
    argsearch,
    card,
    display,
    durable,
    enqueue_form,
    filters,
    graph,
    logs,
    page_actions,
    rollup,
    timeline,
)
from .actions import (
    cancel_jobs,
    delete_finished_jobs,
    release_leases,
    retry_jobs,
    seal_containers,
)
from .actions import (
    logger as actions_logger,
)
from .base import JobPagesAdmin

SHOWN = 20
LIVE_EVERY = 5  # seconds between two refreshes of a running job's page


@admin.register(Job)
class JobAdmin(JobPagesAdmin):
    """All jobs, newest first, and each job's page."""

    list_display = [
        "job",
        "type",
        "version",
        "state_badge",
        "queue_and_group",
        "attempts_of",
        "created",
        "run_time",
        "last_error_line",
    ]
    list_filter = [
        filters.StateFilter,
        filters.QueueFilter,
        filters.GroupFilter,
        filters.TypeFilter,
        filters.VersionFilter,
        filters.HasErrorFilter,
        filters.ContainerFilter,
        filters.UpstreamOfFilter,
        filters.DownstreamOfFilter,
        filters.WorkerFilter,
        filters.CreatedFilter,
        filters.FinishedFilter,
    ]
    ordering = ["-id"]
    search_fields = ["=id"]
    search_help_text = (
        "An exact job id, handler key or unique key; or inside the arguments: args.tenant_id=42 "
        'args.user.name="Ann Lee" (every clause must hold).'
    )
    actions = [retry_jobs, cancel_jobs, release_leases, seal_containers, delete_finished_jobs]
    readonly_fields = [
        "version_line",
        "children_summary",
        "state_badge",
        "attempts_of",
        "cancellation",
        "container",
        "children",
        "upstream",
        "downstream",
        "workflow",
        "workflow_timeline",
        "lease",
        "attempt_errors",
        "traceback",
        "arguments",
        "job_result",
        "runs",
        "job_progress",
        "job_maps",
        "job_steps",
        "waits_for",
        "sequence_place",
        "run_after_time",
        "created_time",
        "updated_time",
        "started_time",
        "finished_time",
    ]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "type",
                    "version_line",
                    "state_badge",
                    "queue",
                    "group_key",
                    "priority",
                    "weight",
                ]
            },
        ),
        (
            "Workflow",
            {
                "fields": [
                    "children_summary",
                    "workflow",
                    "workflow_timeline",
                    "container",
                    "children",
                    "upstream",
                    "downstream",
                    "cancellation",
                    "unique_key",
                    "sequence_place",
                ]
            },
        ),
        (
            "Attempts",
            {
                "fields": [
                    "attempts_of",
                    "timeout",
                    "run_after_time",
                    "attempt_errors",
                    "traceback",
                    "runs",
                ]
            },
        ),
        ("Long job", {"fields": ["job_progress", "job_maps", "waits_for", "job_steps"]}),
        ("Lease", {"fields": ["lease"]}),
        ("Data", {"fields": ["arguments", "job_result"]}),
        ("Times", {"fields": ["created_time", "updated_time", "started_time", "finished_time"]}),
    ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        context = {
            "live_every": LIVE_EVERY,
            "can_enqueue": page_actions.allowed(request, enqueue_form.ENQUEUE),
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: Any = None
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        can_change = self.has_change_permission(request)
        offered = job_actions(job, can_change) if job else []
        steps = durable.retry_points(job) if job and ("retry_jobs", "Retry") in offered else []
        live = job is not None and job.state in Job.LEASED_STATES
        context = {
            "job_actions": offered,
            "retry_steps": steps,
            "live_every": LIVE_EVERY if live else None,
            "job_log": logs.render(job) if job else None,
            **page_actions.context(request, job),
            **card.context(job, offered),
            "can_enqueue": page_actions.allowed(request, enqueue_form.ENQUEUE),
            "can_run_again": bool(job)
            and not job.is_container
            and page_actions.allowed(request, enqueue_form.RUN_AGAIN),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(self.retry_from_step_view)
        send = self.admin_site.admin_view(self.send_event_view)
        run_now = self.admin_site.admin_view(self.run_now_view)
        enqueue = self.admin_site.admin_view(self.enqueue_view)
        again = self.admin_site.admin_view(self.run_again_view)
        pause = self.admin_site.admin_view(self.pause_workflow_view)
        resume = self.admin_site.admin_view(self.resume_workflow_view)
        own = [
            path("enqueue/", enqueue, name="django_jobqueue_job_enqueue"),
            path("<path:object_id>/run-again/", again, name="django_jobqueue_job_run_again"),
            path("<path:object_id>/pause-workflow/", pause, name="django_jobqueue_job_pause"),
            path("<path:object_id>/resume-workflow/", resume, name="django_jobqueue_job_resume"),
            path("<path:object_id>/retry-from-step/", view, name="django_jobqueue_job_retry_step"),
            path("<path:object_id>/send-event/", send, name="django_jobqueue_job_send_event"),
            path("<path:object_id>/run-now/", run_now, name="django_jobqueue_job_run_now"),
        ]
        return own + super().get_urls()

    def send_event_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: send the event the job waits for (permission `send_event`)."""
        return page_actions.send_event_view(self, request, object_id)

    def enqueue_view(self, request: HttpRequest) -> HttpResponse:
        """The enqueue form (permission `enqueue_job`)."""
        return enqueue_form.enqueue_view(self, request)

    def run_again_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: enqueue a job like this one (permission `run_again`)."""
        return enqueue_form.run_again_view(self, request, object_id)

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: make a scheduled job due now (permission `run_now`)."""
        return page_actions.run_now_view(self, request, object_id)

    def pause_workflow_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: pause the job and every job under it (permission `pause_workflow`)."""
        return page_actions.pause_workflow_view(self, request, object_id)

    def resume_workflow_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: resume the job's paused workflow (permission `pause_workflow`)."""
        return page_actions.resume_workflow_view(self, request, object_id)

    def retry_from_step_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: retry a dead or cancelled job, keeping its steps up to the chosen one."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        pk = filters.parse_id(object_id)
        start = request.POST.get("step") == durable.START
        step = None if start else filters.parse_id(request.POST.get("step"))
        if pk is None or (step is None and not start):
            messages.error(request, "Nothing was retried: no such job or step.")
            return redirect(reverse("admin:django_jobqueue_job_changelist"))
        keep: dict[str, int] = {"keep_places_through": 0}
        if step is not None:
            records = JobStep.objects.filter(pk=step, job_id=pk)
            place = records.values_list("place", flat=True).first()
            # A record with a place keeps the records of the places up to its own (also one
            # that a call at an earlier place wrote later, after an error it caught, say).
            keep = {"keep_steps_through": step} if place is None else {"keep_places_through": place}
        try:
            control.retry(pk, **keep)
        except JobQueueError as exc:
            messages.error(request, f"Nothing was retried: {exc}")
            return redirect(display.job_url(pk))
        job = Job.objects.only("pk", "type", "state").get(pk=pk)
        kept = "none of its steps" if start else f"its steps through #{step}"
        self.log_change(request, job, f"Retried (+1 attempt) keeping {kept}")
        actions_logger.info(
            "Admin user %s retried job %s keeping %s", request.user.get_username(), pk,
            "none of its steps" if start else f"its steps through record {step}",
        )  # fmt: skip
        again = "every step runs again" if start else f"the steps after record {step} run again"
        messages.success(request, f"Retried #{pk}: {again}; it is {job.state}.")
        return redirect(display.job_url(pk))

    def response_action(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        """Run an action; from a job page's button, come back to that job's page."""
        response = super().response_action(request, *args, **kwargs)
        picked = request.POST.getlist("_selected_action")
        pk = filters.parse_id(picked[0]) if len(picked) == 1 else None
        if request.POST.get("_job_page") and pk is not None:
            return redirect(display.job_url(pk))
        return response

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None and in_workflow(obj):
            if obj.is_container:
                return self.fieldsets
            # Only a container has a timeline (of its children).
            return [
                (name, {"fields": [f for f in opts["fields"] if f != "workflow_timeline"]})
                for name, opts in self.fieldsets
            ]
        if obj is None:
            return self.fieldsets
        # A job on its own: no picture, no empty container and dependency rows.
        alone = ("Workflow", {"fields": ["cancellation", "unique_key"]})
        return [alone if name == "Workflow" else (name, opts) for name, opts in self.fieldsets]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and str(match.url_name).endswith("_changelist"):
            return self.list_queryset(queryset)
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        """Match an exact id, unique key or handler key: each by an index, never a LIKE scan.

        An OR of them would let the planner walk the whole table in id order for one match;
        the unique keys are looked up first instead (their index), then the id or the type.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        if not filters.searchable(term):
            return queryset.none(), False
        if argsearch.wanted(term):
            try:
                return argsearch.filtered(queryset, argsearch.parse(term)), False
            except argsearch.SearchError as exc:
                messages.error(request, f"Search: {exc}")
                return queryset.none(), False
        # Unordered: with ORDER BY id, SQLite walks the primary key instead of the key's index.
        keyed = list(Job.objects.filter(unique_key=term).values_list("pk", flat=True)[:100])
        number = filters.parse_id(term.lstrip("#"))
        if number is not None:
            return queryset.filter(pk__in=[number, *keyed]), False
        if keyed:
            return queryset.filter(pk__in=keyed), False
        return queryset.filter(type=term), False

    @admin.display(description="ver.")  # narrow: the list fits 1,280 px with the navigation
    def version(self, job: Job) -> str:
        return job.handler_version or "-"

    @admin.display(description="handler version")
    def version_line(self, job: Job) -> str:
        if job.handler_version:
            return f"{job.handler_version} (every run of the job uses this version)"
        if job.first_started_at is None:
            return "- (not started: its first run takes the newest version a worker has)"
        return "- (none: it runs under the handler registered without a version)"

    @admin.display(description="children at a glance")
    def children_summary(self, job: Job) -> SafeString | str:
        return rollup.summary(job) if rollup.is_workflow(job) else "-"

    @admin.display(description="cancellation")
    def cancellation(self, job: Job) -> SafeString | str:
        if job.cancelled_by_id is not None:
            state = Job.objects.filter(pk=job.cancelled_by_id).values_list("state", flat=True)
            return format_html(
                "cancelled because job {} ended badly; retrying that job revives this one",
                display.job_link(job.cancelled_by_id, state.first()),
            )
        blocked = failed_upstream(job) if job.state in Job.FAILED_STATES else None
        if blocked is not None:
            return format_html(
                "it waits on job {}: retry that job first (retrying this one is refused)",
                display.job_link(*blocked),
            )
        holder = key_holder(job) if job.state in Job.FAILED_STATES else None
        if holder is not None:
            return format_html(
                "job {} holds its unique key now and has not finished: retrying this one is "
                "refused",
                display.job_link(*holder),
            )
        if job.state == Job.State.CANCELLED and job.cancel_requested:
            who = operator_cancel(job)
            if who:
                return f"cancelled by operator {who}"
            return "cancelled by an operator or by code (cancel(), or its container's)"
        if job.cancel_requested:
            return "cancellation requested: the running handler is asked to stop"
        if job.state == Job.State.CANCELLED:
            return "cancelled (its container or an upstream job ended badly)"
        return "-"

    @admin.display(description="container")
    def container(self, job: Job) -> SafeString | str:
        if job.parent_id is None:
            return "-"
        row = Job.objects.filter(pk=job.parent_id).values_list("pk", "type", "state").first()
        return display.job_links([row] if row else [], 1, "")

    @admin.display(description="children")
    def children(self, job: Job) -> SafeString | str:
        if not (job.is_container or job.has_children):
            return "-"
        jobs = Job.objects.filter(parent_id=job.pk)
        links = self._links(jobs, {"container": job.pk})
        note = sealing_note(job)
        if not note:
            return links
        return format_html('{}<br><span class="jq-sealing">{}</span>', links, note)

    @admin.display(description="upstream (it waits on)")
    def upstream(self, job: Job) -> SafeString | str:
        jobs = Job.objects.filter(downstream_edges__job_id=job.pk)
        return self._links(jobs, {"upstream_of": job.pk})

    @admin.display(description="downstream (waits on it)")
    def downstream(self, job: Job) -> SafeString | str:
        if not job.has_dependents:
            return "-"
        jobs = Job.objects.filter(upstream_edges__depends_on_id=job.pk)
        return self._links(jobs, {"downstream_of": job.pk})

    @admin.display(description="sequence")
    def sequence_place(self, job: Job) -> SafeString | str:
        if job.sequence is None:
            return "-"
        head = JobSequence.objects.filter(key=job.sequence).values_list("head", flat=True).first()
        heads = []
        if head is not None:
            heads = list(Job.objects.filter(pk=head).values_list("pk", "type", "state"))
        queue = Job.objects.filter(sequence=job.sequence, state__in=Job.UNFINISHED_STATES)
        if head:
            queue = queue.exclude(pk=head)
        rows = list(queue.order_by("pk").values_list("pk", "type", "state")[: SHOWN + 1])
        total = len(rows) if len(rows) <= SHOWN else queue.count()
        blocked = head is not None and (
            Job.objects.filter(pk=head, state=Job.State.DEAD, sequence_blocks=True).exists()
        )
        on_failure = "block" if job.sequence_blocks else "continue"
        return format_html(
            "{} (on failure: {}){}<br>head: {}<br>then: {}",
            job.sequence,
            on_failure,
            mark_safe(' <strong class="jq-blocked">blocked: retry or cancel its head</strong>')
            if blocked
            else "",
            display.job_links(heads, len(heads), "") if heads else "none",
            display.job_links(rows[:SHOWN], total, "") if rows else "none",
        )

    def _links(self, jobs: QuerySet[Job], lookup: dict[str, Any]) -> SafeString | str:
        rows = list(jobs.order_by("pk").values_list("pk", "type", "state")[: SHOWN + 1])
        total = len(rows) if len(rows) <= SHOWN else jobs.count()
        return display.job_links(rows[:SHOWN], total, graph.changelist(**lookup))

    @admin.display(description="picture")
    def workflow(self, job: Job) -> SafeString | str:
        return graph.render(job) if in_workflow(job) else "not part of a workflow"

    @admin.display(description="timeline")
    def workflow_timeline(self, job: Job) -> SafeString | str:
        return timeline.render(job) if job.is_container else ""

    @admin.display(description="workers, one per start")
    def runs(self, job: Job) -> SafeString | str:
        starts = [str(worker) for worker in job.worker_ids or []]
        if not starts:
            return "-"
        return format_html_join(
            mark_safe("<br>"), "start {}: {}", ((n, w) for n, w in enumerate(starts, 1))
        )

    @admin.display(description="lease")
    def lease(self, job: Job) -> SafeString | str:
        if job.lease_owner is None:
            return "no lease (the job is not held by a worker)"
        worker = Worker.objects.filter(pk=job.lease_owner).first()
        if worker is None:
            owner = format_html("{} {}", job.lease_owner, display.warn("(worker gone)"))
        else:
            url = reverse("admin:django_jobqueue_worker_change", args=[worker.pk])
            owner = format_html(
                '<a href="{}">{}</a> (host {}, pid {})', url, worker.pk, worker.host, worker.pid
            )
        if control.owner_alive(job.lease_owner):
            release = (
                "Release lease is not offered: its worker is alive (its heartbeat is current), "
                "and a released job would run twice. Cancel the job instead."
            )
        else:
            release = (
                "Its worker is gone (no heartbeat for a whole lease TTL): Release lease hands "
                "the job back to the queue."
            )
        return format_html(
            "owner: {}<br>expires: {} ({})<br>last heartbeat: {} ago"
            '<br><span class="jq-release">{}</span>',
            owner,
            display.moment(job.lease_expires),
            _expiry(job),
            display.age(job.heartbeat_at),
            release,
        )

    @admin.display(description="errors by attempt")
    def attempt_errors(self, job: Job) -> SafeString:
        return display.errors_table(job.errors)

    @admin.display(description="last traceback")
    def traceback(self, job: Job) -> SafeString:
        return display.traceback((job.last_error or {}).get("traceback"))

    @admin.display(description="arguments")
    def arguments(self, job: Job) -> SafeString:
        return display.pretty_json(job.args)

    @admin.display(description="result")
    def job_result(self, job: Job) -> SafeString:
        return display.pretty_json(job.result)

    @admin.display(description="progress")
    def job_progress(self, job: Job) -> SafeString | str:
        return durable.progress(job)

    @admin.display(description="maps (ctx.map)")
    def job_maps(self, job: Job) -> SafeString | str:
        return durable.maps(job)

    @admin.display(description="steps (durable calls kept across runs)")
    def job_steps(self, job: Job) -> SafeString | str:
        return durable.steps(job)

    @admin.display(description="waits for")
    def waits_for(self, job: Job) -> SafeString | str:
        return durable.waits_for(job)

    run_after_time = display.moment_column("run_after", "run after")
    created_time = display.moment_column("created_at", "created")
    updated_time = display.moment_column("updated_at", "updated")
    started_time = display.moment_column("started_at", "started (its latest claim)")
    finished_time = display.moment_column("finished_at", "finished")


def job_actions(job: Job, can_change: bool) -> list[tuple[str, str]]:
    """The buttons a job's page offers: the actions that apply to the job in its state."""
    if not can_change:
        return []
    if job.state in Job.FAILED_STATES and not job.is_container:
        if sequences.is_blocked_head(conf.get().database, job):
            # The operator's two ways to unblock its sequence (see sequences.py).
            return [("retry_jobs", "Retry"), ("cancel_jobs", "Cancel (skip it)")]
        if failed_upstream(job) is not None:  # retry() would refuse: retry that one
            return []
        if key_holder(job) is not None:  # retry() would refuse: its key is taken
            return []
        return [("retry_jobs", "Retry")]
    if job.is_container and not job.sealed and job.state == Job.State.WAITING:
        return [("seal_containers", "Seal"), ("cancel_jobs", "Cancel")]
    if containers.was_failed_unsealed(job):
        return [("seal_containers", "Seal")]
    if job.state in Job.LEASED_STATES:
        if control.owner_alive(job.lease_owner):  # releasing would run the job twice
            return [("cancel_jobs", "Cancel")]
        return [("cancel_jobs", "Cancel"), ("release_leases", "Release lease")]
    if job.state not in Job.TERMINAL_STATES:
        return [("cancel_jobs", "Cancel")]
    return []


def key_holder(job: Job) -> tuple[int, str] | None:
    """The unfinished job (its id and state) that holds the unique key of `job` now, or None:
    while there is one, retrying `job` is refused (two unfinished jobs never share a key)."""
    if not job.unique_key:
        return None
    row = (
        Job.objects.filter(unique_key=job.unique_key, unique_slot__isnull=False)
        .exclude(pk=job.pk)
        .values_list("pk", "state")
        .first()
    )
    return (int(row[0]), str(row[1])) if row else None


def failed_upstream(job: Job) -> tuple[int, str] | None:
    """An upstream job of `job` that is dead or cancelled (its id and state), or None: while
    there is one, retrying `job` is refused (retry that one, which revives this one)."""
    row = (
        Job.objects.filter(downstream_edges__job_id=job.pk, state__in=Job.FAILED_STATES)
        .order_by("pk")
        .values_list("pk", "state")
        .first()
    )
    return (int(row[0]), str(row[1])) if row else None


def sealing_note(job: Job) -> str:
    """Why a container is open, or was failed for being open, and what Seal does about it."""
    timeout = conf.get().open_container_timeout
    after = (
        f"Workers fail it once nothing is added to it for {timeout:g}s (OPEN_CONTAINER_TIMEOUT)."
        if timeout is not None
        else "OPEN_CONTAINER_TIMEOUT is None: nothing fails it."
    )
    if job.state == Job.State.WAITING and not job.sealed:
        return (
            "Open (not sealed): it takes more children until the container() block that "
            "made it exits. If that producer died inside the block, it stays open and the jobs "
            "after it wait. Seal: the children enqueued so far are the whole container. "
            f"Cancel: cancel it with its children. {after}"
        )
    if containers.was_failed_unsealed(job):
        return (
            "Failed because it was never sealed (its producer likely died inside "
            "container()). Seal: accept the children enqueued so far; it re-opens, the jobs "
            "its failure cancelled wait again, and it finishes with its children."
        )
    return ""


def operator_cancel(job: Job) -> str:
    """Who cancelled `job` from the admin and when, from its latest "Cancelled" LogEntry."""
    entry = (
        LogEntry.objects.filter(
            content_type=ContentType.objects.get_for_model(Job),
            object_id=str(job.pk),
            action_flag=CHANGE,
            change_message__startswith="Cancelled",
        )
        .select_related("user")
        .order_by("-action_time")
        .first()
    )
    if entry is None:
        return ""
    return f"{entry.user.get_username()} at {display.when(entry.action_time)}"


def in_workflow(job: Job) -> bool:
    """Whether the job has a container, children, upstream or downstream jobs."""
    return bool(
        job.parent_id is not None
        or job.is_container
        or job.has_children
        or job.has_dependents
        or JobDependency.objects.filter(job_id=job.pk).exists()
    )


def _expiry(job: Job) -> SafeString:
    left = display.age(job.lease_expires)
    if left.startswith("in "):
        return format_html("{}", left)
    return display.warn(f"EXPIRED {left} ago")
