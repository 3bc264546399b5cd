"""What the admin's one-page models share (Limits, Schedules): a page instead of a list."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from . import display


class OnePageAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """A model shown as one page (`template`, with `page_context()`) to users with its view
    permission; nobody adds or deletes its rows here, and a row's own page leads back."""

    title = ""
    template = ""

    class Media:
        css = {"all": [display.STYLESHEET]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def page_context(self, request: HttpRequest) -> dict[str, Any]:
        """What the page's template shows besides the admin's own context."""
        raise NotImplementedError

    def page_url(self) -> str:
        meta = self.model._meta
        return reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": self.title,
            "opts": self.model._meta,
            **self.page_context(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.template, context)

    def change_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return HttpResponseRedirect(self.page_url())
