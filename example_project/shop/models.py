"""The shop's one model: an order whose fulfilment the job workflow drives."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """A customer order; the jobs in ``shop/jobs.py`` move it from `new` to `completed`."""

    class Status(models.TextChoices):
        NEW = "new", "new"  # saved, its jobs are queued
        COMPLETED = "completed", "completed"  # stock reserved, card charged, receipt sent

    number = models.CharField(max_length=20, unique=True)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.NEW)
    # One flag per independent job, so the two jobs that run side by side never write the
    # same column; send_receipt sets the status once both are done.
    stock_reserved = models.BooleanField(default=False)
    paid = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"Order {self.number} ({self.status})"
