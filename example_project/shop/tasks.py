"""Django Tasks of the shop, run by django_jobqueue (``settings.TASKS`` names its backend).

These are plain ``django.tasks`` tasks, defined with Django's own ``@task`` decorator. Their
``.enqueue()`` writes a job into the same queue, in the caller's transaction, and the same
``jobqueue_worker`` runs them next to the handlers in ``shop/jobs.py``. django_jobqueue
autodiscovers this module (as it does ``jobs.py``) when ``TASKS`` uses its backend, so every
worker process knows these tasks: a worker runs no task it has not seen defined.
"""

from __future__ import annotations

import time
from typing import Any

from django.tasks import TaskContext, task

import django_jobqueue as jobqueue

from .models import Order


@task(takes_context=True)
def notify_customer(context: TaskContext, order_id: int) -> dict[str, Any]:
    """Tell the customer their order is complete (here: compose the message and return it).

    `shop_place_order` enqueues it to run after `send_receipt`, through JobQueueTask.using()'s
    ``depends_on``; a real shop would send an email, at least once, hence idempotently.
    """
    try:
        order = Order.objects.get(pk=order_id)
    except Order.DoesNotExist:
        raise jobqueue.Fail(f"Order {order_id} does not exist") from None
    if order.status != Order.Status.COMPLETED:
        raise RuntimeError(f"Order {order.number} is {order.status}, not completed yet")
    return {
        "order": order.number,
        "message": f"Your order {order.number} ({order.total}) is complete.",
        "attempt": context.attempt,
    }


@task(takes_context=True)
def email_tracking(context: TaskContext, order_id: int) -> dict[str, Any]:
    """Send the tracking number that ship_order returned (here: compose the message).

    The demo (`shop_demo`) enqueues it with ``.using(depends_on=[ship], group="ops")``: a task
    is a job like any other, so it is cancelled when ship_order dies and revived with it by
    ``jobqueue.retry()``. The context's ``job`` (django_jobqueue's JobContext) holds the
    upstream jobs' results.
    """
    try:
        order = Order.objects.get(pk=order_id)
    except Order.DoesNotExist:
        raise jobqueue.Fail(f"Order {order_id} does not exist") from None
    upstream = context.job.upstream_results.values()  # type: ignore[attr-defined]
    tracking = [r["tracking"] for r in upstream if isinstance(r, dict)]
    time.sleep(0.1)
    return {"order": order.number, "message": f"Your order ships as {', '.join(tracking)}"}
