"""Read-only admin views of jobs and workers."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import Job, Worker


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Show rows; never add, change or delete them from the admin (yet)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "type",
        "state",
        "queue",
        "group_key",
        "attempts",
        "max_attempts",
        "priority",
        "run_after",
        "created_at",
        "finished_at",
    ]
    list_filter = ["state", "queue", "type"]
    search_fields = ["=id", "type", "group_key"]
    date_hierarchy = "created_at"
    readonly_fields = ["error_message", "error_traceback"]
    fieldsets = [
        (None, {"fields": ["type", "state", "queue", "group_key", "weight", "priority", "parent"]}),
        (
            "Workflow",
            {
                "fields": [
                    "is_container",
                    "sealed",
                    "unique_key",
                    "cancel_requested",
                    "cancelled_by",
                ]
            },
        ),
        (
            "Attempts",
            {
                "fields": [
                    "attempts",
                    "max_attempts",
                    "timeout",
                    "run_after",
                    "error_message",
                    "error_traceback",
                ]
            },
        ),
        ("Data", {"fields": ["args", "result", "errors", "worker_ids"]}),
        ("Lease", {"fields": ["lease_owner", "lease_expires", "heartbeat_at"]}),
        ("Times", {"fields": ["created_at", "updated_at", "started_at", "finished_at"]}),
    ]

    @admin.display(description="last error")
    def error_message(self, job: Job) -> str:
        error = job.last_error or {}
        return f"{error.get('type', '')}: {error.get('message', '')}" if error else ""

    @admin.display(description="traceback")
    def error_traceback(self, job: Job) -> str:
        return str((job.last_error or {}).get("traceback", ""))


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["id", "host", "pid", "concurrency", "queues", "started_at", "heartbeat_at"]
