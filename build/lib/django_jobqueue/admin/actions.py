"""Admin actions: retry, cancel, release a stuck lease, delete finished jobs.

Each action goes through the library's own operations (control.retry/cancel, repair.*), which
lock the row they judge and write under that lock or match it in the UPDATE, so a worker
changing the same job at the same moment never has its write undone by a stale read. At most
ACTION_LIMIT jobs are handled per run, so "select all" over a million rows stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .. import control, repair
from ..exceptions import JobQueueError
from ..models import Job

ACTION_LIMIT = 1000
SHOWN_SKIPS = 10


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
        widget=forms.NumberInput(attrs={"min": 1, "max": 100, "style": "width:4em"}),
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


def _each(
    queryset: QuerySet[Any], operate: Callable[[int], str | None]
) -> tuple[list[str], dict[int, str], int]:
    """Apply `operate` to each selected id: a string is a change, None or an error a skip."""
    ids, left = _ids(queryset)
    changed: list[str] = []
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
            changed.append(outcome)
    return changed, skipped, left


@admin.action(permissions=["change"], description=_("Retry selected dead or cancelled jobs"))
def retry_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    """Give dead or cancelled jobs more attempts and revive what their failure cancelled."""
    form = ExtraAttemptsForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Extra attempts must be a whole number from 1 to 100.")
        return
    extra = form.cleaned_data["extra_attempts"] or 1

    def operate(pk: int) -> str:
        job = control.retry(pk, extra_attempts=extra)
        return f"#{pk} {job.state}"

    report(request, "Retried", *_each(queryset, operate))


@admin.action(permissions=["change"], description=_("Cancel selected unfinished jobs"))
def cancel_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    """Cancel jobs that have not finished: at once if not started, cooperatively if running."""

    def operate(pk: int) -> str | None:
        if not control.cancel(pk):
            return None
        state = Job.objects.filter(pk=pk).values_list("state", flat=True).first()
        return f"#{pk} {'cancel requested' if state in Job.LEASED_STATES else state}"

    report(request, "Cancelled", *_each(queryset, operate))


@admin.action(permissions=["change"], description=_("Release selected stuck leases"))
def release_leases(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    """Hand leases that no live worker holds back to `ready`."""
    report(
        request,
        "Released",
        *_each(queryset, lambda pk: f"#{pk} {repair.release_lease(pk)}"),
    )


@admin.action(permissions=["delete_finished"], description=_("Delete selected finished jobs"))
def delete_finished_jobs(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> None:
    """Delete finished jobs that no unfinished job still needs."""
    ids, left = _ids(queryset)
    deleted, kept = repair.delete_finished(ids)
    report(request, "Deleted", [f"#{pk}" for pk in deleted], kept, left)
