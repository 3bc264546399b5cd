"""Handlers of the job log lines' tests (tests/telemetry/test_job_logs*.py): they log through
ctx.logger."""

from __future__ import annotations

import asyncio
import logging
import time

import django_jobqueue as jobqueue
from django_jobqueue.models import Job

from .durable_jobs import mark


@jobqueue.handler("logs.retried", takes_context=True)
def retried(ctx: jobqueue.JobContext, fail_until: int = 0) -> str:
    """Log a few lines (one of each level, one with markup), failing the first attempts."""
    ctx.logger.debug("debug line of attempt %s", ctx.attempt)
    ctx.logger.info("starting attempt %s of job %s", ctx.attempt, ctx.job_id)
    ctx.logger.warning("markup: <script>alert('x')</script> & more")
    if ctx.attempt <= fail_until:
        try:
            raise ValueError(f"boom on attempt {ctx.attempt}")
        except ValueError:
            ctx.logger.exception("attempt %s failed", ctx.attempt)
            raise
    ctx.logger.info("done on attempt %(attempt)s", {"attempt": ctx.attempt})
    return "ok"


@jobqueue.handler("logs.aretried", takes_context=True)
async def aretried(ctx: jobqueue.AsyncJobContext, fail_until: int = 0) -> str:
    """The async twin of logs.retried, with a step between its lines."""
    ctx.logger.info("async attempt %s begins", ctx.attempt)
    await ctx.step("pause", asyncio.sleep, 0)
    ctx.logger.warning("async <b>bold</b> after the step")
    if ctx.attempt <= fail_until:
        raise ValueError(f"async boom on attempt {ctx.attempt}")
    ctx.logger.info("async done on attempt %s", ctx.attempt)
    return "ok"


@jobqueue.handler("logs.flood", takes_context=True)
def flood(ctx: jobqueue.JobContext, count: int, long: int = 0) -> int:
    """Log `count` numbered lines, then one line of `long` characters."""
    for number in range(count):
        ctx.logger.info("line %s", number)
    if long:
        ctx.logger.info("x" * long)
    return count


@jobqueue.handler("logs.odd", takes_context=True)
def odd(ctx: jobqueue.JobContext) -> None:
    """A line no database stores as it is (a NUL), and one every database takes (an emoji).
    (A lone surrogate is tested without logging it: pytest-xdist cannot send such a record.)"""
    ctx.logger.info("nul:\x00:end")
    ctx.logger.info("emoji: \N{SNAKE}")


@jobqueue.handler("logs.waits", takes_context=True)
def waits(ctx: jobqueue.JobContext, key: str, count: int = 3) -> None:
    """Log `count` lines before and after waiting for event `key` (two runs, one attempt)."""
    for number in range(count):
        ctx.logger.info("before %s", number)
    ctx.wait_for_event(key)
    for number in range(count):
        ctx.logger.info("after %s", number)


@jobqueue.handler("logs.self_deleting", takes_context=True)
def self_deleting(ctx: jobqueue.JobContext) -> None:
    """Log a line, then delete the job's own row: its lines cannot be stored."""
    ctx.logger.info("about to vanish")
    Job.objects.filter(pk=ctx.job_id).delete()


@jobqueue.handler("logs.crashes", takes_context=True)
def crashes(ctx: jobqueue.JobContext, marker: str, hold: float = 60.0) -> str:
    """Log, record a step (its lines are written), log more, then on the first attempt hold
    (the test kills the worker): the lines after the step are lost with it."""
    ctx.logger.info("before the step, attempt %s", ctx.attempt)
    ctx.step("one", lambda: "one")
    ctx.logger.info("after the step, attempt %s", ctx.attempt)
    if ctx.attempt == 1:
        mark(marker, "holding")
        time.sleep(hold)
    return "survived"


async def _one() -> str:
    return "one"


@jobqueue.handler("logs.acrashes", takes_context=True)
async def acrashes(ctx: jobqueue.AsyncJobContext, marker: str, hold: float = 60.0) -> str:
    """The async twin of logs.crashes (its step a coroutine function: awaited on the loop)."""
    ctx.logger.info("async before the step, attempt %s", ctx.attempt)
    await ctx.step("one", _one)
    ctx.logger.info("async after the step, attempt %s", ctx.attempt)
    if ctx.attempt == 1:
        mark(marker, "holding")
        await asyncio.sleep(hold)
    return "survived"


@jobqueue.handler("logs.plain_logging", takes_context=True)
def plain_logging(ctx: jobqueue.JobContext) -> None:
    """A line through a module's own logger (not kept) and one through ctx.logger (kept)."""
    logging.getLogger("tests.testapp.log_jobs").warning("through the module's logger")
    ctx.logger.warning("through ctx.logger")


@jobqueue.handler("logs.hangs", takes_context=True)
def hangs(ctx: jobqueue.JobContext, seconds: float = 30.0) -> None:
    """Log a line, then run past any short timeout."""
    ctx.logger.warning("about to hang")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)
