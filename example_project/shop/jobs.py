"""Job handlers of the shop, registered by key; django_jobqueue autodiscovers this module.

A handler is called with the job's ``args`` as keyword arguments and returns a JSON-able
result, stored on the job. Delivery is at-least-once (a crashed attempt runs again), so each
handler is idempotent: running it twice leaves the order as running it once does.
"""

from __future__ import annotations

from typing import Any

import django_jobqueue as jobqueue

from .models import Order


def _order(order_id: int) -> Order:
    """Return the order, or fail the job for good: retrying would not bring it back."""
    try:
        return Order.objects.get(pk=order_id)
    except Order.DoesNotExist:
        raise jobqueue.Fail(f"Order {order_id} does not exist") from None


@jobqueue.handler("shop.reserve_stock")
def reserve_stock(order_id: int) -> dict[str, Any]:
    """Reserve the order's goods in the warehouse (here: set a flag)."""
    order = _order(order_id)
    Order.objects.filter(pk=order.pk).update(stock_reserved=True)
    return {"order": order.number, "stock_reserved": True}


@jobqueue.handler("shop.charge_card")
def charge_card(order_id: int) -> dict[str, Any]:
    """Charge the customer's card for the order's total (here: a made-up charge id)."""
    order = _order(order_id)
    Order.objects.filter(pk=order.pk).update(paid=True)
    return {"order": order.number, "amount": str(order.total), "charge_id": f"ch_{order.number}"}


@jobqueue.handler("shop.send_receipt", takes_context=True)
def send_receipt(ctx: jobqueue.JobContext, order_id: int) -> dict[str, Any]:
    """Compose the receipt from the upstream jobs' results and complete the order."""
    order = _order(order_id)
    upstream = ctx.upstream_results  # {job id: result} of reserve_stock and charge_card
    results = [r for r in upstream.values() if isinstance(r, dict)]
    charge = next((r for r in results if "charge_id" in r), None)
    reserved = any(r.get("stock_reserved") for r in results)
    if charge is None or not reserved:
        raise jobqueue.Fail(f"Order {order.number}: upstream results are missing: {upstream}")
    receipt = f"Order {order.number}: {charge['amount']} charged as {charge['charge_id']}"
    Order.objects.filter(pk=order.pk).update(status=Order.Status.COMPLETED)
    return {"order": order.number, "receipt": receipt, "upstream_jobs": sorted(upstream)}
