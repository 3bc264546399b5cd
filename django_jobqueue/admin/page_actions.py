"""A job page's own actions, each under a permission of its own: send the event a waiting job
waits for (`django_jobqueue.send_event`), make a scheduled job due now
(`django_jobqueue.run_now`), pause or resume the job's workflow, the job and every job under
it (`django_jobqueue.pause_workflow`).

Each is a POST to a URL of the job (`<id>/send-event/`, `<id>/run-now/`,
`<id>/pause-workflow/`, `<id>/resume-workflow/`) that comes back to its page with a message.
The page offers a button only to a user holding the permission and only in the state it
fits; the view checks both again, as a forged POST must do nothing.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.urls import reverse

from .. import pausing
from ..engine import control, events
from ..exceptions import JobQueueError
from ..models import Job, JobWait, PausedWorkflow
from . import display, filters
from .actions import logger

SEND_EVENT = "send_event"
RUN_NOW = "run_now"
PAUSE_RESOURCE = "pause_resource"  # the Limits page's pause of a resource (admin.limits)
PAUSE_WORKFLOW = "pause_workflow"


def allowed(request: HttpRequest, permission: str) -> bool:
    """Whether the user holds `django_jobqueue.<permission>`."""
    return bool(request.user.has_perm(f"django_jobqueue.{permission}"))


def event_key(job: Job) -> str | None:
    """The key of the event `job` waits for (ctx.wait_for_event), or None."""
    if job.state != Job.State.WAITING:
        return None
    waits = JobWait.objects.filter(job_id=job.pk, count__isnull=True).exclude(key="")
    return waits.values_list("key", flat=True).first()


def context(request: HttpRequest, job: Job | None) -> dict[str, Any]:
    """What the job page needs to show these actions: each only where it applies."""
    key = event_key(job) if job is not None and allowed(request, SEND_EVENT) else None
    scheduled = job is not None and job.state == Job.State.SCHEDULED
    workflow = None  # "pause" or "resume", the workflow button the page offers
    if job is not None and allowed(request, PAUSE_WORKFLOW):
        if PausedWorkflow.objects.using(job._state.db).filter(job_id=job.pk).exists():
            workflow = "resume"
        elif job.state not in Job.TERMINAL_STATES:
            workflow = "pause"
    return {
        "send_event_key": key,
        "can_run_now": scheduled and allowed(request, RUN_NOW),
        "workflow_action": workflow,
    }


def _guard(request: HttpRequest, permission: str, object_id: str) -> int | HttpResponse:
    """The job id of a POST by a user with `permission`; 405 for a GET, 403 without it."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not allowed(request, permission):
        raise PermissionDenied
    pk = filters.parse_id(object_id)
    if pk is None or not Job.objects.filter(pk=pk).exists():
        messages.error(request, "Nothing was done: no such job.")
        return redirect(reverse("admin:django_jobqueue_job_changelist"))
    return pk


def send_event_view(modeladmin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: send the event job `object_id` waits for, with the form's JSON payload."""
    pk = _guard(request, SEND_EVENT, object_id)
    if isinstance(pk, HttpResponse):
        return pk
    text = request.POST.get("payload", "").strip()
    try:
        payload = json.loads(text) if text else None
    except ValueError as exc:
        messages.error(request, f"Nothing was sent: the payload is not JSON ({exc}).")
        return redirect(display.job_url(pk))
    job = Job.objects.only("pk", "type", "state").get(pk=pk)
    key = event_key(job)
    if key is None:
        messages.error(
            request, f"Nothing was sent: job #{pk} waits for no event (it is {job.state})."
        )
        return redirect(display.job_url(pk))
    try:
        sent = events.send_event(key, payload)
    except JobQueueError as exc:
        messages.error(request, f"Nothing was sent: {exc}")
        return redirect(display.job_url(pk))
    if not sent:  # sent meanwhile: the job has its payload (the first one sent is kept)
        messages.warning(request, f"Event {key!r} was already sent: nothing changed.")
        return redirect(display.job_url(pk))
    modeladmin.log_change(request, job, f"Sent event {key!r}")
    logger.info("Admin user %s sent event %r for job %s", request.user.get_username(), key, pk)
    messages.success(
        request, f"Sent event {key!r}: job #{pk} and any other job waiting for it resume."
    )
    return redirect(display.job_url(pk))


def run_now_view(modeladmin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: make scheduled job `object_id` due now (`control.run_now`)."""
    pk = _guard(request, RUN_NOW, object_id)
    if isinstance(pk, HttpResponse):
        return pk
    if not control.run_now(pk):
        state = Job.objects.filter(pk=pk).values_list("state", flat=True).first()
        messages.error(request, f"Nothing was changed: job #{pk} is {state}, not scheduled.")
        return redirect(display.job_url(pk))
    job = Job.objects.only("pk", "type", "state").get(pk=pk)
    modeladmin.log_change(request, job, "Run now")
    logger.info("Admin user %s made job %s due now", request.user.get_username(), pk)
    messages.success(request, f"Job #{pk} is due now: it is {job.state}.")
    return redirect(display.job_url(pk))


def pause_workflow_view(modeladmin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: pause job `object_id` and every job under it (`pausing.pause_workflow`)."""
    pk = _guard(request, PAUSE_WORKFLOW, object_id)
    if isinstance(pk, HttpResponse):
        return pk
    job = Job.objects.only("pk", "type", "state").get(pk=pk)
    if job.state in Job.TERMINAL_STATES:
        messages.error(request, f"Nothing was paused: job #{pk} is {job.state}.")
    elif not pausing.pause_workflow(pk):
        messages.warning(request, f"Workflow #{pk} was paused already.")
    else:
        modeladmin.log_change(request, job, "Paused workflow")
        logger.info("Admin user %s paused workflow %s", request.user.get_username(), pk)
        messages.success(
            request,
            f"Paused workflow #{pk}: workers start neither it nor any job under it (within a "
            "second); running ones finish.",
        )
    return redirect(display.job_url(pk))


def resume_workflow_view(modeladmin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """POST: resume the workflow paused at job `object_id` (`pausing.resume_workflow`)."""
    pk = _guard(request, PAUSE_WORKFLOW, object_id)
    if isinstance(pk, HttpResponse):
        return pk
    if not pausing.resume_workflow(pk):
        messages.warning(request, f"Workflow #{pk} was not paused.")
    else:
        job = Job.objects.only("pk", "type", "state").get(pk=pk)
        modeladmin.log_change(request, job, "Resumed workflow")
        logger.info("Admin user %s resumed workflow %s", request.user.get_username(), pk)
        messages.success(request, f"Resumed workflow #{pk}.")
    return redirect(display.job_url(pk))
