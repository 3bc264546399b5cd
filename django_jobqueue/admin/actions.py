"""Admin actions: retry, cancel, release a stuck lease, seal an open container, delete jobs.

Each action goes through the library's own operations (`control`), which
lock the row they judge and write under that lock or match it in the UPDATE, so a worker
changing the same job at the same moment never has its write undone by a stale read. At most
ACTION_LIMIT jobs are handled per request: "select all" over more asks for a confirmation
and hands the whole filtered list to a job of the queue (bulk.py), which works through it in
batches of ACTION_LIMIT.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _

from .. import containers
from ..engine import control
from ..exceptions import JobQueueError
from ..models import Job

logger = logging.getLogger(__name__)

ACTION_LIMIT = 1000
SHOWN_SKIPS = 10
# The job fields a LogEntry needs (its object_repr is str(job)): never the JSON columns.
LOGGED_FIELDS = ("pk", "type", "state")
# What an operation did to a batch: {id: what it became}, {id: why it was skipped}.
Batch = tuple[dict[int, str], dict[int, str]]


class ExtraAttemptsForm(forms.Form):
    """The extra attempt budget that `retry_jobs` grants (1 when left empty)."""

    extra_attempts = forms.IntegerField(
        label=_("Extra attempts (retry):"), min_value=1, max_value=100, initial=1, required=False
    )


class JobActionForm(ActionForm):
    """The actions bar, with the extra attempt budget beside the action menu.

    A text field here: the action checks it (ExtraAttemptsForm) and says what is wrong,
    where a bad value in the bar itself would only read "No action selected".
    """

    extra_attempts = forms.CharField(
        label=_("Extra attempts (retry):"),
        required=False,
        initial="1",
        widget=forms.NumberInput(attrs={"min": 1, "max": 100, "class": "jq-extra-attempts"}),
    )


def _ids(queryset: QuerySet[Any]) -> tuple[list[int], int]:
    """The first ACTION_LIMIT selected ids (oldest first), and how many were left out."""
    ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: ACTION_LIMIT + 1])
    if len(ids) <= ACTION_LIMIT:
        return ids, 0
    return ids[:ACTION_LIMIT], queryset.count() - ACTION_LIMIT


def report(
    request: HttpRequest, verb: str, changed: list[str], skipped: dict[int, str], left: int
) -> None:
    """Tell the operator how many jobs changed, which were skipped and why."""
    level = messages.SUCCESS if changed else messages.WARNING
    text = f"{verb} {len(changed)} job{'s' if len(changed) != 1 else ''}"
    if changed and len(changed) <= SHOWN_SKIPS:
        text += f" ({', '.join(changed)})"
    text += "."
    if skipped:
        shown = [f"#{pk}: {why}" for pk, why in sorted(skipped.items())[:SHOWN_SKIPS]]
        more = len(skipped) - len(shown)
        text += f" Skipped {len(skipped)}: " + "; ".join(shown)
        text += f"; and {more} more." if more else "."
    if left:
        text += f" {left} selected jobs were not handled (at most {ACTION_LIMIT} per run)."
    messages.add_message(request, level, text)


def _each(ids: list[int], operate: Callable[[int], str | None]) -> Batch:
    """Apply `operate` to each id: a string is a change, None or an error a skip."""
    changed: dict[int, str] = {}
    skipped: dict[int, str] = {}
    for pk in ids:
        try:
            outcome = operate(pk)
        except JobQueueError as exc:
            skipped[pk] = str(exc).replace(f"Job {pk} ", "it ", 1).rstrip(".")
            continue
        if outcome is None:
            skipped[pk] = "it has already finished"
        else:
            changed[pk] = outcome
    return changed, skipped


def shown_ids(ids: list[int]) -> str:
    """The first SHOWN_SKIPS of `ids` for a log line, and how many more there are."""
    text = ",".join(str(pk) for pk in ids[:SHOWN_SKIPS])
    return f"{text} and {len(ids) - SHOWN_SKIPS} more" if len(ids) > SHOWN_SKIPS else text


def record(
    modeladmin: Any,
    request: HttpRequest,
    verb: str,
    changed: dict[int, str],
    skipped: int,
    detail: str = "",
) -> None:
    """Write a LogEntry per changed job (its History) and one INFO line naming the operator.

    The entries are written for Job itself, not for the proxy whose page ran the action, so
    the job's own page lists them whichever list the operator acted from.
    """
    jobs = Job.objects.filter(pk__in=list(changed)).only(*LOGGED_FIELDS).order_by("pk")
    for job in jobs:
        modeladmin.log_change(request, job, f"{verb}{detail}: {changed[job.pk]}")
    logger.info(
        "Admin user %s %s%s %s jobs ids=[%s] (%s skipped)",
        request.user.get_username(),
        verb.lower(),
        detail,
        len(changed),
        shown_ids(sorted(changed)),
        skipped,
    )


# -- the operations, on a batch of ids (the page's selection, or a batch of a bulk job) ------


def _retry(modeladmin: Any, request: HttpRequest, ids: list[int], options: dict[str, Any]) -> Batch:
    extra = options["extra_attempts"]
    changed, skipped = _each(ids, lambda pk: str(control.retry(pk, extra_attempts=extra).state))
    budget = f" (+{extra} attempt{'s' if extra != 1 else ''})"
    record(modeladmin, request, "Retried", changed, len(skipped), budget)
    return changed, skipped


def _cancel_one(pk: int) -> str | None:
    # Read before: a running job's handler may see the request and end `cancelled` before a
    # read after the cancel, and the operator asked a running job to stop, not cancelled it.
    before = Job.objects.filter(pk=pk).values_list("state", flat=True).first()
    if not control.cancel(pk):
        return None
    if before in Job.LEASED_STATES:
        return "cancel requested"
    state = Job.objects.filter(pk=pk).values_list("state", flat=True).first()
    return "cancel requested" if state in Job.LEASED_STATES else str(state)


def _recorded(
    verb: str, operate: Callable[[int], str | None]
) -> Callable[[Any, HttpRequest, list[int], dict[str, Any]], Batch]:
    def run(
        modeladmin: Any, request: HttpRequest, ids: list[int], options: dict[str, Any]
    ) -> Batch:
        changed, skipped = _each(ids, operate)
        record(modeladmin, request, verb, changed, len(skipped))
        return changed, skipped

    return run


def _delete(
    modeladmin: Any, request: HttpRequest, ids: list[int], options: dict[str, Any]
) -> Batch:
    # Read before the delete, as Django's own delete action does: a LogEntry names its row.
    before = {job.pk: job for job in Job.objects.filter(pk__in=ids).only(*LOGGED_FIELDS)}
    deleted, kept = control.delete_finished(ids)
    modeladmin.log_deletions(request, [before[pk] for pk in deleted if pk in before])
    logger.info(
        "Admin user %s deleted %s jobs ids=[%s] (%s kept)",
        request.user.get_username(),
        len(deleted),
        shown_ids(sorted(deleted)),
        len(kept),
    )
    return dict.fromkeys(deleted, "deleted"), kept


@dataclasses.dataclass(frozen=True)
class Operation:
    """What an action does to a batch of job ids: `run` returns (changed, skipped)."""

    verb: str  # "Retried": the report's first word
    does: str  # "retries": what a bulk job does to the jobs
    run: Callable[[Any, HttpRequest, list[int], dict[str, Any]], Batch]


OPERATIONS = {
    "retry_jobs": Operation("Retried", "retries", _retry),
    "cancel_jobs": Operation("Cancelled", "cancels", _recorded("Cancelled", _cancel_one)),
    "release_leases": Operation(
        "Released", "releases the leases of", _recorded("Released lease", control.release_lease)
    ),
    "seal_containers": Operation("Sealed", "seals", _recorded("Sealed", containers.seal_open)),
    "delete_finished_jobs": Operation("Deleted", "deletes", _delete),
}


def _act(
    name: str,
    modeladmin: Any,
    request: HttpRequest,
    queryset: QuerySet[Any],
    options: dict[str, Any],
) -> HttpResponse | None:
    """Run action `name` on the selection: the page's rows, or after a confirmation the whole
    filtered list ("select all"), at once up to ACTION_LIMIT jobs and by a job beyond."""
    # The admin's (base.JobPagesAdmin), which knows bulk.py: this module stays below it.
    response: HttpResponse | None = modeladmin.select_all_response(name, request, queryset, options)
    if response is not None:
        return response
    ids, left = _ids(queryset)
    operation = OPERATIONS[name]
    changed, skipped = operation.run(modeladmin, request, ids, options)
    shown = [f"#{pk}" if s == "deleted" else f"#{pk} {s}" for pk, s in changed.items()]
    report(request, operation.verb, shown, skipped, left)
    return None


# -- the actions --------------------------------------------------------------------------------


@admin.action(permissions=["change"], description=_("Retry selected dead or cancelled jobs"))
def retry_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
    """Give dead or cancelled jobs more attempts and revive what their failure cancelled."""
    form = ExtraAttemptsForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Extra attempts must be a whole number from 1 to 100.")
        return None
    extra = form.cleaned_data["extra_attempts"] or 1
    return _act("retry_jobs", modeladmin, request, queryset, {"extra_attempts": extra})


@admin.action(permissions=["change"], description=_("Cancel selected unfinished jobs"))
def cancel_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
    """Cancel jobs that have not finished: at once if not started, cooperatively if running."""
    return _act("cancel_jobs", modeladmin, request, queryset, {})


@admin.action(permissions=["change"], description=_("Release selected stuck leases"))
def release_leases(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
    """Hand leases whose worker is gone back to `ready`."""
    return _act("release_leases", modeladmin, request, queryset, {})


@admin.action(permissions=["change"], description=_("Seal selected open containers"))
def seal_containers(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
    """Seal open containers (or ones failed as not sealed): their children so far are all."""
    return _act("seal_containers", modeladmin, request, queryset, {})


@admin.action(permissions=["delete_finished"], description=_("Delete selected finished jobs"))
def delete_finished_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
    """Delete finished jobs that no unfinished job still needs."""
    return _act("delete_finished_jobs", modeladmin, request, queryset, {})
