"""Admin for orders (the queue's own admin shows their jobs)."""

from __future__ import annotations

from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """List orders with the flags their jobs set."""

    list_display = ["number", "total", "status", "stock_reserved", "paid", "created_at"]
    list_filter = ["status"]
    search_fields = ["number"]
