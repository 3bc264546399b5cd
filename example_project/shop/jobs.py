"""Job handlers of the shop, registered by key; django_jobqueue autodiscovers this module.

A handler is called with the job's ``args`` as keyword arguments and returns a JSON-able
result, stored on the job. Delivery is at-least-once (a crashed attempt runs again), so each
handler is idempotent: running it twice leaves the order as running it once does.
"""

from __future__ import annotations

import time
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


# The handlers of `make demo`'s story (manage.py shop_demo). They sleep to stand in for work,
# so that the live display has something to show.


@jobqueue.handler("shop.sync_product")
def sync_product(tenant: str, sku: str, ms: int) -> dict[str, Any]:
    """Copy one product from the tenant's supplier into its catalogue (here: `ms` ms of sleep)."""
    time.sleep(ms / 1000)
    return {"tenant": tenant, "sku": sku}


@jobqueue.handler("shop.publish_catalogue")
def publish_catalogue(tenant: str) -> dict[str, Any]:
    """Publish the tenant's catalogue; it depends on the container of its product syncs."""
    time.sleep(0.2)
    return {"tenant": tenant, "published": True}


@jobqueue.handler("shop.fetch_rates", takes_context=True)
def fetch_rates(ctx: jobqueue.JobContext, currency: str) -> dict[str, Any]:
    """Fetch exchange rates from a flaky service: the first attempt always times out."""
    time.sleep(0.2)
    if ctx.attempt == 1:
        # Any exception fails the attempt; the job is retried after a backoff.
        raise ConnectionError("exchange-rate service timed out")
    return {"currency": currency, "eur": "1.08", "attempt": ctx.attempt}


@jobqueue.handler("shop.ship_order")
def ship_order(order_id: int) -> dict[str, Any]:
    """Hand a paid order to the carrier; an unpaid one fails for good (Fail: no retries)."""
    order = _order(order_id)
    time.sleep(0.2)
    if not order.paid:
        raise jobqueue.Fail(f"Order {order.number} is not paid: not shipping it")
    return {"order": order.number, "tracking": f"TRK-{order.number}"}


@jobqueue.handler("shop.rebuild_search", takes_context=True)
def rebuild_search(ctx: jobqueue.JobContext, batches: int) -> dict[str, Any]:
    """Rebuild the search index batch by batch, stopping early when cancelled."""
    for done in range(batches):
        if ctx.cancelled:  # jobqueue.cancel() was called: stop; the job ends `cancelled`
            return {"batches": done, "stopped_early": True}
        time.sleep(0.1)
    return {"batches": batches, "stopped_early": False}


# A version: a job runs under the version that first ran it, on every later run. A release
# that changes the steps registers version "2" beside this one, and the reports already
# waiting for an approval finish under "1" (docs: "Changing a durable handler safely").
@jobqueue.handler("shop.monthly_report", takes_context=True, version="1")
def monthly_report(ctx: jobqueue.JobContext, month: str, pages: int) -> dict[str, Any]:
    """A durable job: fetch each page once (a step kept across runs), wait for a manager's
    approval (the job holds no thread meanwhile), then publish."""
    rows = 0
    for page in range(1, pages + 1):
        rows += ctx.step("fetch", _fetch_page, month, page)
        ctx.progress(page, pages, f"fetched page {page} of {pages}")
    approval = ctx.wait_for_event(f"approve-report:{month}", timeout=600)
    return dict(ctx.step("publish", _publish, month, rows, approval["by"]))


def _fetch_page(month: str, page: int) -> int:
    time.sleep(0.2)  # a slow, rate-limited API
    return 10 + page


def _publish(month: str, rows: int, by: str) -> dict[str, Any]:
    return {"month": month, "rows": rows, "approved_by": by}


@jobqueue.handler("shop.summarize_reviews", takes_context=True)
async def summarize_reviews(
    ctx: jobqueue.AsyncJobContext, tenant: str, reviews: int
) -> dict[str, Any]:
    """An async durable job that pays a model by the token: each call takes room in the
    tenant's daily token budget (ctx.acquire), is a step (made once, whatever the crashes),
    and settles what the model really used (ctx.settle), which gives the rest back."""
    used = 0
    for review in range(1, reviews + 1):
        grant = await ctx.acquire(f"llm-tokens:{tenant}", 800)  # the call's estimate
        summary = await ctx.step("summarize", _call_model, review)
        await ctx.settle(grant, summary["tokens"])
        used += summary["tokens"]
        await ctx.progress(review, reviews, f"summarized review {review} of {reviews}")
    return {"tenant": tenant, "reviews": reviews, "tokens": used}


async def _call_model(review: int) -> dict[str, Any]:
    """Stands in for an async model client's call (httpx, the OpenAI or Anthropic SDK)."""
    import asyncio

    await asyncio.sleep(0.1)
    return {"summary": f"review {review}: happy customer", "tokens": 300 + 40 * review}
