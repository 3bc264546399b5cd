"""Enqueue from the admin: a form (permission `django_jobqueue.enqueue_job`), and a job page's
"Run again" (permission `django_jobqueue.run_again`).

The form takes a handler of the registry, its arguments as a JSON object, a queue, a priority,
a time to run after and the resources it uses (`uses`, JSON). It goes through `enqueue()`
itself, which checks everything before it writes: bad input is shown on the form, and nothing
was written. `?from=<id>` fills the form from a job (to change its arguments, then enqueue).

"Run again" enqueues a job of the same handler with the same arguments, queue, group, weight,
priority, timeout, resources, unique key and sequence: not its dependencies nor its container
(a job enqueued later has none). A unique key still held by an unfinished job enqueues
nothing, as `enqueue()` does.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils import timezone

from .. import conf, registry
from ..engine import enqueuing
from ..exceptions import InvalidArgumentsError, InvalidJobError, UnknownHandlerError
from ..models import Job
from . import display, filters
from .actions import logger
from .page_actions import allowed

ENQUEUE = "enqueue_job"
RUN_AGAIN = "run_again"


def handler_choices() -> list[tuple[str, str]]:
    """The handler keys of the registry an operator may enqueue: not the queue's own."""
    keys = [key for key in registry.allowlist() if not key.startswith(filters.INTERNAL_PREFIX)]
    return [("", "---------"), *((key, key) for key in keys)]


def _json(text: str, what: str, example: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise forms.ValidationError(f"{what} is not JSON: {exc}.") from None
    if not isinstance(value, dict):
        raise forms.ValidationError(f"{what} must be a JSON object, such as {example}.")
    return value


class EnqueueForm(forms.Form):
    """What `enqueue()` takes from an operator; every other option at its default."""

    handler = forms.ChoiceField(label="Handler", choices=handler_choices)
    args = forms.CharField(
        label="Arguments (a JSON object)",
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 60, "class": "jq-code"}),
        help_text='The keyword arguments of the handler, such as {"account_id": 42}.',
    )
    queue = forms.CharField(
        label="Queue", required=False, max_length=100, help_text="Empty: the default queue."
    )
    priority = forms.IntegerField(
        label="Priority", required=False, initial=0, help_text="Higher runs first in its group."
    )
    run_after = forms.DateTimeField(
        label="Run after",
        required=False,
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": 1}, format="%Y-%m-%dT%H:%M:%S"
        ),
        help_text="Empty: now.",
    )
    uses = forms.CharField(
        label="Uses (a JSON object)",
        required=False,
        widget=forms.TextInput(attrs={"size": 40, "class": "jq-code"}),
        help_text='The resources of its limits and their units, such as {"openai": 1}. Empty: '
        "its handler's default.",
    )

    def clean_args(self) -> dict[str, Any]:
        text = self.cleaned_data["args"].strip()
        return _json(text, "The arguments", '{"account_id": 42}') if text else {}

    def clean_uses(self) -> dict[str, Any] | None:
        text = self.cleaned_data["uses"].strip()
        return _json(text, "Uses", '{"openai": 1}') if text else None

    def clean_queue(self) -> str | None:
        return self.cleaned_data["queue"].strip() or None

    def enqueue(self) -> Job | None:
        """Enqueue the job; on bad input put the error on its field and return None."""
        data = self.cleaned_data
        try:
            return enqueuing.enqueue(
                data["handler"],
                data["args"],
                queue=data["queue"],
                priority=0 if data["priority"] is None else data["priority"],
                run_after=data["run_after"],
                uses=data["uses"],
            )
        except InvalidJobError as exc:
            self.add_error(_field_of(exc), str(exc))
            return None


def _field_of(exc: InvalidJobError) -> str | None:
    """The form field an error of `enqueue()` is about (None: the whole form)."""
    if isinstance(exc, UnknownHandlerError):
        return "handler"
    if isinstance(exc, InvalidArgumentsError):
        return "args"
    text = str(exc).lower()
    for field in ("uses", "run_after", "priority", "queue"):
        if text.startswith(field) or f" {field}" in text[:40]:
            return field
    return "args" if "argument" in text else None


def initial_from(job: Job) -> dict[str, Any]:
    """The form's fields filled from `job`: its handler, arguments, queue, priority, uses."""
    return {
        "handler": job.type,
        "args": json.dumps(job.args, indent=2, sort_keys=True, ensure_ascii=False),
        "queue": job.queue,
        "priority": job.priority,
        "uses": json.dumps(job.uses) if job.uses else "",
    }


def enqueue_view(modeladmin: Any, request: HttpRequest) -> HttpResponse:
    """GET: the form (filled from job `?from=<id>`); POST: enqueue, or show what is wrong."""
    if not allowed(request, ENQUEUE):
        raise PermissionDenied
    if request.method == "POST":
        form = EnqueueForm(request.POST)
        job = form.enqueue() if form.is_valid() else None
        if job is not None:
            modeladmin.log_addition(request, job, "Enqueued from the admin")
            logger.info(
                "Admin user %s enqueued job %s (%s)", request.user.get_username(), job.pk, job.type
            )
            messages.success(request, f"Enqueued job #{job.pk} ({job.type}): it is {job.state}.")
            return redirect(display.job_url(job.pk))
    elif request.method == "GET":
        source = filters.parse_id(request.GET.get("from"))
        copied = Job.objects.filter(pk=source).first() if source is not None else None
        form = EnqueueForm(initial=initial_from(copied) if copied else None)
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Enqueue a job",
        "opts": modeladmin.model._meta,
        "form": form,
        "default_queue": conf.get().default_queue,
        "time_zone": timezone.get_current_timezone_name(),
    }
    return TemplateResponse(request, "admin/django_jobqueue/enqueue.html", context)


def run_again_view(modeladmin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: enqueue a job like job `object_id` (permission `run_again`)."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not allowed(request, RUN_AGAIN):
        raise PermissionDenied
    pk = filters.parse_id(object_id)
    job = Job.objects.filter(pk=pk).first() if pk is not None else None
    if job is None or job.is_container:
        messages.error(request, "Nothing was enqueued: no such job, or it is a container.")
        return redirect("admin:django_jobqueue_job_changelist")
    before = timezone.now()
    try:
        again = enqueuing.enqueue(job.type, job.args, **options_of(job))
    except InvalidJobError as exc:
        messages.error(request, f"Nothing was enqueued: {exc}")
        return redirect(display.job_url(job.pk))
    if again.created_at < before:  # the unfinished job that holds the unique key
        messages.warning(
            request,
            f"Nothing was enqueued: job #{again.pk} holds unique key {job.unique_key!r} and "
            f"has not finished ({again.state}).",
        )
        return redirect(display.job_url(again.pk))
    modeladmin.log_addition(request, again, f"Enqueued again with the arguments of job #{job.pk}")
    logger.info(
        "Admin user %s enqueued job %s again as job %s",
        request.user.get_username(), job.pk, again.pk,
    )  # fmt: skip
    messages.success(
        request,
        f"Enqueued job #{again.pk} with the arguments of job #{job.pk}: it is {again.state}.",
    )
    return redirect(display.job_url(again.pk))


def options_of(job: Job) -> dict[str, Any]:
    """The `enqueue()` options that made `job`, as far as its row keeps them."""
    options: dict[str, Any] = {
        "queue": job.queue,
        "group": job.group_key,
        "weight": job.weight,
        "priority": job.priority,
        "timeout": job.timeout,
        "uses": job.uses,
        "unique_key": job.unique_key,
    }
    if job.sequence:
        options["sequence"] = job.sequence
        options["sequence_on_failure"] = "block" if job.sequence_blocks else "continue"
    return options
