"""manage.py shop_report: show each order, the jobs that ran for it, and their outcomes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q
from django.tasks import TaskResultStatus, default_task_backend

from django_jobqueue.models import Job
from shop.models import Order

COLUMNS = ("job", "type", "state", "attempts", "result")


class Command(BaseCommand):
    help = "Print every order with its jobs: id, type, state, attempts and result (or error)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--check",
            action="store_true",
            help="Exit with an error unless every job is done and every order completed.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        orders = list(Order.objects.order_by("pk"))
        if not orders:
            self.stdout.write("No orders yet: run `manage.py shop_place_order`.")
        unfinished = 0
        for order in orders:
            # Handler jobs take {"order_id": ...}; a Django task's job stores its call as
            # {"args": [...], "kwargs": {"order_id": ...}}.
            jobs = list(
                Job.objects.filter(
                    Q(args__order_id=order.pk) | Q(args__kwargs__order_id=order.pk)
                ).order_by("pk")
            )
            unfinished += sum(job.state != Job.State.DONE for job in jobs)
            unfinished += order.status != Order.Status.COMPLETED
            self.stdout.write(
                f"\nOrder {order.number}: total {order.total}, status {order.status} "
                f"(stock reserved: {_yes(order.stock_reserved)}, paid: {_yes(order.paid)})"
            )
            self._table([_row(job) for job in jobs])
            for job in jobs:
                if job.type.startswith("task:"):
                    self._task(str(job.pk))
        if options["check"]:
            if unfinished:
                raise CommandError(f"{unfinished} job(s) or order(s) are not finished.")
            self.stdout.write(self.style.SUCCESS("\nAll jobs done, all orders completed."))

    def _task(self, result_id: str) -> None:
        """One line on a Django task, read through the Tasks API (get_result -> TaskResult)."""
        result = default_task_backend.get_result(result_id)
        if result.status == TaskResultStatus.SUCCESSFUL:
            outcome = f"returned {json.dumps(result.return_value)}"
        elif result.errors:
            outcome = f"last error {result.errors[-1].exception_class_path}"
        else:
            outcome = "not finished"
        self.stdout.write(
            f"  Django task {result.task.name} (result id {result.id}): {result.status}, "
            f"attempts {result.attempts}, {outcome}"
        )

    def _table(self, rows: list[tuple[str, ...]]) -> None:
        """Write `rows` under COLUMNS, each column as wide as its widest cell."""
        widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS) - 1)]
        for row in [COLUMNS, *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
            self.stdout.write("  " + "  ".join([*cells, row[-1]]))


def _row(job: Job) -> tuple[str, ...]:
    """One table row; a job that failed shows its last error instead of a result."""
    if job.state == Job.State.DONE or not job.last_error:
        outcome = json.dumps(job.result)
    else:
        outcome = f"error: {job.last_error.get('type')}: {job.last_error.get('message')}"
    return (str(job.pk), job.type, job.state, str(job.attempts), outcome)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
