"""Handlers of the quota limits' tests (tests/limits/test_limits*.py)."""

from __future__ import annotations

import os
import time
from typing import Any

import django_jobqueue as jobqueue

from .models import RunRecord


def _run(ctx: jobqueue.JobContext, sleep: float) -> None:
    started = time.time()
    if sleep:
        time.sleep(sleep)
    RunRecord.objects.create(
        job_id=ctx.job_id, attempt=ctx.attempt, worker_pid=os.getpid(), started=started,
        finished=time.time(),
    )  # fmt: skip


@jobqueue.handler("limits.work", takes_context=True)
def work(ctx: jobqueue.JobContext, sleep: float = 0.0, tenant: int | None = None) -> None:
    """Record the run's start and end (RunRecord) around `sleep` seconds."""
    _run(ctx, sleep)


@jobqueue.handler(
    "limits.tenant_work",
    takes_context=True,
    uses=lambda args: {f"tenant:{args['tenant']}": 1},
)
def tenant_work(ctx: jobqueue.JobContext, tenant: int, sleep: float = 0.0) -> None:
    """A job of one tenant: its handler says it uses "tenant:<tenant>" by default."""
    _run(ctx, sleep)


@jobqueue.handler("limits.static_default", uses={"api": 1})
def static_default() -> None:
    return None


@jobqueue.handler("limits.rate_limited_once", takes_context=True)
def rate_limited_once(ctx: jobqueue.JobContext, resource: str, retry_after: float) -> Any:
    """The first run meets a 429: RateLimited(resource, retry_after). The next one records."""
    if not RunRecord.objects.filter(job_id=ctx.job_id, attempt=0).exists():
        RunRecord.objects.create(job_id=ctx.job_id, attempt=0, started=time.time(),
                                 finished=time.time())  # fmt: skip
        raise jobqueue.RateLimited(resource, retry_after=retry_after)
    _run(ctx, 0.0)
    return "after the cooldown"


@jobqueue.handler("limits.rate_limited_twice", takes_context=True)
def rate_limited_twice(ctx: jobqueue.JobContext, resource: str) -> Any:
    """The first two runs meet a 429 (RateLimited for 0.5 s, then 1 s); the third returns."""
    met = RunRecord.objects.filter(job_id=ctx.job_id, attempt__lte=0).count()
    if met < 2:  # a record per 429 met (attempt 0, then -1: the attempt is never charged)
        RunRecord.objects.create(job_id=ctx.job_id, attempt=-met, started=time.time(),
                                 finished=time.time())  # fmt: skip
        raise jobqueue.RateLimited(resource, retry_after=0.5 * (met + 1))
    return "after two cooldowns"


@jobqueue.handler("limits.spawner", takes_context=True)
def spawner(ctx: jobqueue.JobContext) -> list[int]:
    """Spawns one child that uses "api"."""
    return [ctx.spawn("limits.work", uses={"api": 1}).pk]
