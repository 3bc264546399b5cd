"""The Limits page: each limit of JOBQUEUE["LIMITS"] with what it holds now, and the actions
of `jobqueue_limits` (change a limit, reset it, reopen a resource closed by RateLimited), of
`jobqueue_pause` for queues, and of `jobqueue_pause --resource` (under its own permission,
`django_jobqueue.pause_resource`)."""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from .. import conf, pausing, validation
from ..dialects import get_dialect
from ..engine import occupancy
from ..exceptions import InvalidJobError
from ..models import Job, Limit
from . import filters, page_actions
from .pages import OnePageAdmin

logger = logging.getLogger("django_jobqueue.admin.actions")
ACTIONS = ("set", "reset", "reopen", "pause", "resume", "pause_resource", "resume_resource")
# The actions under django_jobqueue.pause_resource rather than the change permission.
RESOURCE_ACTIONS = ("pause_resource", "resume_resource")


class LimitActionForm(forms.Form):
    """One action on one limit, posted from the page."""

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    name = forms.CharField(max_length=255)
    concurrency = forms.IntegerField(required=False, min_value=1)
    rate = forms.CharField(required=False, max_length=40)

    def clean(self) -> dict[str, Any]:
        """Refuse a name the action cannot take (a queue, or a limit), as the commands do."""
        data = super().clean() or {}
        if "name" in data and "action" in data:
            try:
                if data["action"] in ("pause", "resume"):
                    validation.check_label("queue", data["name"], 100)
                elif data["action"] in RESOURCE_ACTIONS:
                    pausing.check_resource(data["name"])
                else:
                    occupancy.check_name(data["name"])
            except InvalidJobError as exc:
                self.add_error("name", str(exc))
        return data


@admin.register(Limit)
class LimitAdmin(OnePageAdmin):
    """One page instead of a list of lock rows: occupancy, and changes that apply live."""

    title = "Limits"
    template = "admin/django_jobqueue/limits.html"

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            if request.POST.get("action") in RESOURCE_ACTIONS:
                allowed = page_actions.allowed(request, page_actions.PAUSE_RESOURCE)
            else:
                allowed = self.has_change_permission(request)
            if not self.has_view_permission(request) or not allowed:
                raise PermissionDenied
            self._act(request, get_dialect(conf.get().database))
            return HttpResponseRedirect(self.page_url())
        return super().changelist_view(request, extra_context)

    def page_context(self, request: HttpRequest) -> dict[str, Any]:
        dialect = get_dialect(conf.get().database)
        paused = pausing.paused_resources(dialect.using)
        entries = occupancy.occupancy(dialect)
        for entry in entries:
            entry["paused_by"] = [name for name in paused if pausing.matches(name, entry["name"])]
        return {
            "entries": entries,
            "paused_resources": paused,
            "can_pause": page_actions.allowed(request, page_actions.PAUSE_RESOURCE),
            "spend_hour": occupancy.spend(dialect, 60),
            "spend_day": occupancy.spend(dialect, 24 * 60),
            "queues": queues(dialect.using),
            "can_change": self.has_change_permission(request),
        }

    def _act(self, request: HttpRequest, dialect: Any) -> None:
        form = LimitActionForm(request.POST)
        if not form.is_valid():
            messages.error(request, f"Nothing was changed: {form.errors.as_text()}")
            return
        data = form.cleaned_data
        name = data["name"]
        try:
            if data["action"] in ("pause", "resume"):
                done = _pause_or_resume(data["action"], name)
            elif data["action"] in RESOURCE_ACTIONS:
                done = _pause_or_resume_resource(data["action"], name)
            elif data["action"] == "set":
                if data["concurrency"] is None and not data["rate"]:
                    raise InvalidJobError("give a concurrency, a rate, or both")
                occupancy.set_limit(
                    dialect, name, concurrency=data["concurrency"], rate=data["rate"] or None
                )
                done = f"Changed limit {name!r}; running workers apply it within 2 s."
            elif data["action"] == "reset":
                changed = occupancy.reset_limit(dialect, name)
                done = (
                    f"Limit {name!r} is back to its settings."
                    if changed
                    else (f"Limit {name!r} was not changed.")
                )
            else:
                reopened = occupancy.reopen(dialect, name)
                done = f"Reopened {name!r}." if reopened else f"{name!r} was not closed."
        except InvalidJobError as exc:
            messages.error(request, f"Nothing was changed: {exc}")
            return
        logger.info(
            "Admin user %s %s limit %r (concurrency=%s rate=%s)",
            request.user.get_username(), data["action"], name, data["concurrency"],
            data["rate"] or None,
        )  # fmt: skip
        messages.success(request, done)


def queues(using: str) -> list[dict[str, Any]]:
    """The queues an operator may pause or resume: the paused ones, the configured ones, and
    those that unfinished or recent jobs use (bounded reads, as the list filters)."""
    settings = conf.get()
    paused = set(pausing.paused_queues(using))
    names = {settings.default_queue, *settings.queue_limits, *paused}
    recent = Job.objects.using(using).order_by("-pk")[: filters.RECENT]
    names.update(recent.values_list("queue", flat=True))
    return [{"name": name, "paused": name in paused} for name in sorted(names)]


def _pause_or_resume(action: str, name: str) -> str:
    if action == "pause":
        return (
            f"Paused queue {name!r}."
            if pausing.pause_queue(name)
            else (f"Queue {name!r} was paused already.")
        )
    return (
        f"Resumed queue {name!r}."
        if pausing.resume_queue(name)
        else (f"Queue {name!r} was not paused.")
    )


def _pause_or_resume_resource(action: str, name: str) -> str:
    what = "resources matching" if name.endswith("*") else "resource"
    if action == "pause_resource":
        return (
            f"Paused {what} {name!r}: workers start none of their jobs (within a second); "
            "running ones finish."
            if pausing.pause_resource(name)
            else f"{name!r} was paused already."
        )
    return (
        f"Resumed {what} {name!r}."
        if pausing.resume_resource(name)
        else f"{name!r} was not paused."
    )
