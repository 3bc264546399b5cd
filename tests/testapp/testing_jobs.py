"""Handlers for the tests of django_jobqueue.testing (imported by jobs.py to register them)."""

from __future__ import annotations

from typing import Any

import django_jobqueue as jobqueue

from .models import Order, RunRecord


@jobqueue.handler("helpers.record", takes_context=True)
def record(ctx: jobqueue.JobContext, label: str = "", fail_until: int = 0) -> dict[str, Any]:
    """Leave a RunRecord per attempt (its pk gives the run order); fail while attempt <= fail_until.

    The result names the label and the upstream results it saw, by the upstream's label.
    """
    RunRecord.objects.create(job_id=ctx.job_id, attempt=ctx.attempt)
    if ctx.attempt <= fail_until:
        raise RuntimeError(f"{label}: attempt {ctx.attempt} fails")
    seen = sorted(v["label"] for v in ctx.upstream_results.values() if isinstance(v, dict))
    return {"label": label, "saw": seen}


@jobqueue.handler("helpers.count_orders")
def count_orders() -> int:
    """Read rows the test wrote (uncommitted inside the test's transaction)."""
    return Order.objects.count()


@jobqueue.handler("helpers.forever", takes_context=True)
def forever(ctx: jobqueue.JobContext, n: int = 0) -> int:
    """Enqueue the next of an endless chain."""
    jobqueue.enqueue("helpers.forever", {"n": n + 1})
    return n


@jobqueue.handler("helpers.fan_out")
def fan_out(count: int) -> int:
    """Enqueue `count` children from inside a handler."""
    for number in range(count):
        jobqueue.enqueue("test.add", {"a": number, "b": 1})
    return count


@jobqueue.handler("helpers.db_error", takes_context=True)
def db_error(ctx: jobqueue.JobContext) -> None:
    """Write a row, then fail with a database error (a duplicate of that row)."""
    RunRecord.objects.create(job_id=ctx.job_id, attempt=ctx.attempt)
    RunRecord.objects.create(job_id=ctx.job_id, attempt=ctx.attempt)  # IntegrityError


@jobqueue.handler("helpers.cancel_self", takes_context=True)
def cancel_self(ctx: jobqueue.JobContext) -> str:
    """Ask for this job's own cancellation while it runs, then return a result."""
    jobqueue.cancel(ctx.job_id)
    return "finished anyway"


@jobqueue.handler("helpers.context", takes_context=True)
def context(ctx: jobqueue.JobContext) -> dict[str, Any]:
    """Report what the context says while run_jobs() holds the lease."""
    return {"attempt": ctx.attempt, "renewed": ctx.renew_lease(), "cancelled": ctx.cancelled}
