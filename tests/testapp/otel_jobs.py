"""Handlers of the telemetry tests (tests/telemetry/test_telemetry*.py)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import RateLimited

logger = logging.getLogger("tests.otel_jobs")  # tests/otel_support.JOB_LOGGER


def _fetch() -> dict[str, int]:
    logger.info("fetching")
    return {"rows": 3}


def _store(rows: int) -> int:
    return rows * 2


@jobqueue.handler("otel.pipeline", takes_context=True)
def pipeline(ctx: jobqueue.JobContext) -> int:
    """Two steps, a sleep between them, and one spawned child."""
    fetched = ctx.step("fetch", _fetch)
    ctx.sleep(0.2)
    ctx.spawn("otel.child", {"n": fetched["rows"]})
    logger.info("spawned the child")
    return int(ctx.step("store", _store, fetched["rows"]))


@jobqueue.handler("otel.child")
def child(n: int) -> int:
    logger.info("child of %s", n)
    return n + 1


@jobqueue.handler("otel.broken")
def broken() -> None:
    raise ValueError("bad row")


@jobqueue.handler("otel.limited")
def limited() -> None:
    raise RateLimited("otel-api", 0.5)


@jobqueue.handler("otel.async_steps", takes_context=True)
async def async_steps(ctx: jobqueue.AsyncJobContext) -> int:
    async def one() -> int:
        return 1

    first = await ctx.step("one", one)
    second = await ctx.step("two", _store, first)
    return int(second)


@jobqueue.handler("otel.tokens", takes_context=True)
def tokens(ctx: jobqueue.JobContext) -> None:
    """Grants and settlements of resources that count tokens (input, output, one of a
    pattern), and of one that does not."""
    ctx.settle(ctx.acquire("llm-input", 100), 80)
    ctx.settle(ctx.acquire("llm-output", 50), 30)
    ctx.settle(ctx.acquire("tenant-tokens:7", 40), 20)
    ctx.settle(ctx.acquire("otel-rated", 3), 2)


@jobqueue.handler("otel.hold")
def hold(flag: str) -> None:
    """Hold the units of its `uses` until the file `flag` exists (a minute at most)."""
    deadline = time.monotonic() + 60
    while not Path(flag).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


@jobqueue.handler("otel.async_tokens", takes_context=True)
async def async_tokens(ctx: jobqueue.AsyncJobContext) -> None:
    """As otel.tokens, from an async handler (its calls run on the job's sync-call thread)."""
    await ctx.settle(await ctx.acquire("llm-input", 100), 80)
    await ctx.settle(await ctx.acquire("llm-output", 50), 30)
