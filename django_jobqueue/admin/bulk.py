"""Actions over a whole filtered list: the admin's "select all N", however many jobs match.

Django passes an action the whole filtered queryset when the operator picks "Select all". Here
such a run first shows a confirmation page with the number of matching jobs. Once confirmed,
up to ACTION_LIMIT jobs are handled in the request, as a page's selection is; more are handed
to a job of the queue itself (handler BULK_HANDLER), so that no request outlives its timeout.

That job rebuilds the list as the operator saw it: the same admin page, the same filters and
search (from the list's query string), as the same user, whose permission for the action is
checked again. It works through the matching jobs in id order, in batches of ACTION_LIMIT, each
job through the same operation as a click (one transaction per job, a LogEntry each), and
records its progress (`ctx.progress`). A job that stops half way and runs again goes on from
the start: what it already did no longer matches a dead-jobs filter, and doing it again is
skipped (a retry of a running job, a cancel of a finished one).
"""

from __future__ import annotations

import logging
from typing import Any

from django.apps import apps
from django.contrib import messages
from django.contrib.admin.sites import all_sites
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from .. import registry
from ..engine import enqueuing
from ..engine.context import JobContext
from ..exceptions import Fail
from .actions import ACTION_LIMIT, OPERATIONS

BULK_HANDLER = "jobqueue.admin_bulk_action"
CONFIRMED = "jq_bulk_confirmed"
logger = logging.getLogger(__name__)


def by_filter(
    name: str,
    modeladmin: Any,
    request: HttpRequest,
    queryset: QuerySet[Any],
    options: dict[str, Any],
) -> HttpResponse | None:
    """The response of a "select all" run of action `name`, or None to run it in the request.

    Not confirmed yet: the confirmation page. Confirmed, with more than ACTION_LIMIT jobs: the
    job that does it is enqueued and the list shown again with a link to it.
    """
    if request.POST.get("select_across") != "1":
        return None
    count = queryset.count()
    if request.POST.get(CONFIRMED) != "yes":
        return _confirmation(name, modeladmin, request, count)
    if count <= ACTION_LIMIT:
        return None
    site = modeladmin.admin_site.name
    job = enqueuing.enqueue(
        BULK_HANDLER,
        {
            "action": name,
            "site": site,
            "model": modeladmin.model._meta.model_name,
            "query": request.GET.urlencode(),
            "user": request.user.pk,
            "options": options,
        },
        max_attempts=3,
    )
    messages.success(
        request,
        format_html(
            '{} matching jobs are handed to job <a href="{}">#{}</a>, which {} them in batches '
            "of {}: its page shows how far it has got.",
            f"{count:,}",
            reverse(f"{site}:django_jobqueue_job_change", args=[job.pk]),
            job.pk,
            OPERATIONS[name].does,
            f"{ACTION_LIMIT:,}",
        ),
    )
    logger.info(
        "Admin user %s handed %s of %s jobs to job %s (%s)",
        request.user.get_username(),
        name,
        count,
        job.pk,
        request.GET.urlencode() or "no filter",
    )
    return HttpResponseRedirect(request.get_full_path())


def _confirmation(name: str, modeladmin: Any, request: HttpRequest, count: int) -> HttpResponse:
    """The page that asks "do this to all N jobs?", and posts the same action back."""
    opts = modeladmin.model._meta
    action = modeladmin.get_actions(request).get(name)
    # The form's fields as they were posted (the action, its index, the extra attempts, the
    # page's ticked rows, which Django's list insists on even for "select all").
    kept = [
        (key, value)
        for key, values in request.POST.lists()
        if key not in ("csrfmiddlewaretoken", CONFIRMED)
        for value in values
    ]
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Are you sure?",
        "opts": opts,
        "description": _description(action, name),
        "count": count,
        "count_text": f"{count:,}",
        "in_request": count <= ACTION_LIMIT,
        "limit": ACTION_LIMIT,
        "filters": [(k, v) for k, v in request.GET.items() if k != "p"],
        "kept": kept,
        "confirmed": CONFIRMED,
        "back": request.get_full_path(),
    }
    return TemplateResponse(request, "admin/django_jobqueue/bulk_confirm.html", context)


@registry.handler(BULK_HANDLER, takes_context=True)
def run_bulk_action(
    ctx: JobContext,
    action: str,
    site: str,
    model: str,
    query: str,
    user: Any,
    options: dict[str, Any],
) -> dict[str, int]:
    """Apply an admin action to every job of a filtered list, in batches (the job's handler)."""
    modeladmin, request = _as_operator(site, model, query, user)
    # The page's actions for this user: Django leaves out those the user lacks permission for.
    if action not in modeladmin.get_actions(request) or action not in OPERATIONS:
        raise Fail(f"User {user} may no longer run {action!r} on this admin page.")
    matching = modeladmin.get_changelist_instance(request).queryset.order_by("pk")
    total = matching.count()
    operation = OPERATIONS[action]
    changed = skipped = 0
    last = 0
    while True:
        ids = list(matching.filter(pk__gt=last).values_list("pk", flat=True)[:ACTION_LIMIT])
        if not ids:
            break
        done, passed = operation.run(modeladmin, request, ids, options)
        changed += len(done)
        skipped += len(passed)
        last = ids[-1]
        ctx.progress(
            changed + skipped,
            max(total, changed + skipped),
            f"{operation.verb} {changed:,}, skipped {skipped:,}",
        )
    return {"matched": total, "changed": changed, "skipped": skipped}


def _as_operator(site: str, model: str, query: str, user: Any) -> tuple[Any, HttpRequest]:
    """The admin page of `model` on admin site `site`, and a request for its list with the
    query string `query`, made by `user`."""
    admin_site = next((s for s in all_sites if s.name == site), None)
    if admin_site is None:
        raise Fail(f"No admin site is named {site!r}.")
    modeladmin = admin_site._registry.get(apps.get_model("django_jobqueue", model))
    if modeladmin is None:
        raise Fail(f"{model!r} has no page on admin site {site!r}.")
    operator = get_user_model()._default_manager.filter(pk=user).first()
    if operator is None or not operator.is_active or not operator.is_staff:
        raise Fail(f"User {user} no longer exists, is inactive or is no longer staff.")
    request = HttpRequest()
    request.method = "GET"
    request.GET = QueryDict(query)
    request.user = operator
    request.path = reverse(f"{site}:django_jobqueue_{model}_changelist")
    return modeladmin, request


def _description(action: Any, name: str) -> str:
    """An action's description: an Action's attribute (Django 6.1), a tuple's third item."""
    if action is None:
        return name
    if isinstance(action, tuple):
        return str(action[2])
    return str(action.description)
