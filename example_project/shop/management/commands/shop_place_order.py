"""manage.py shop_place_order: save an order and enqueue its workflow, in one transaction."""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.db.models import Max

import django_jobqueue as jobqueue
from shop.models import Order
from shop.tasks import notify_customer


def _amount(text: str) -> Decimal:
    """Parse a positive amount with at most two decimal places."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount") from None
    if not value.is_finite() or value <= 0 or value != value.quantize(Decimal("0.01")):
        raise argparse.ArgumentTypeError(f"{text!r} must be positive, with at most 2 decimals")
    return value.quantize(Decimal("0.01"))


class Command(BaseCommand):
    help = (
        "Save an order and enqueue its jobs in the same transaction: reserve_stock and "
        "charge_card (independent), then send_receipt once both are done, then the Django "
        "task notify_customer."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--total", type=_amount, default=Decimal("25.00"), help="Amount.")
        parser.add_argument("--number", help="Order number (default: ORD-<next id>).")

    def handle(self, *args: Any, **options: Any) -> None:
        # One transaction: either the order and all three jobs exist, or none of them does.
        # A worker cannot see the jobs before the order is committed.
        with transaction.atomic():
            number = options["number"] or _next_number()
            order = Order.objects.create(number=number, total=options["total"])
            job_args = {"order_id": order.pk}
            reserve = jobqueue.enqueue("shop.reserve_stock", job_args)
            charge = jobqueue.enqueue("shop.charge_card", job_args)
            receipt = jobqueue.enqueue("shop.send_receipt", job_args, depends_on=[reserve, charge])
            # A Django task, enqueued through django_jobqueue's backend (settings.TASKS): the
            # same queue, the same transaction; using(depends_on=...) is the backend's extra.
            notify = notify_customer.using(depends_on=[receipt]).enqueue(order_id=order.pk)
        self.stdout.write(f"Order {order.number} saved (id {order.pk}, total {order.total}):")
        for job in (reserve, charge, receipt):
            after = f"  (after jobs {reserve.pk}, {charge.pk})" if job is receipt else ""
            self.stdout.write(f"  job {job.pk:<4} {job.type:<20} {job.state}{after}")
        name = notify.task.name
        after = f"(after job {receipt.pk})"
        self.stdout.write(f"  task {notify.id:<3} {name:<20} {notify.status}  {after}")


def _next_number() -> str:
    """Return ORD-<highest order id + 1>, e.g. ORD-0001."""
    highest = Order.objects.aggregate(highest=Max("pk"))["highest"] or 0
    return f"ORD-{highest + 1:04d}"
