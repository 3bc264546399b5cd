"""Async handlers of the durable jobs' tests (tests/durable/test_durable_async*.py): the same
durable calls as durable_jobs.py, awaited. Calls that must be counted across crashes append a
line to a marker file, as there."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import django_jobqueue as jobqueue

from .durable_jobs import lines as lines_of
from .durable_jobs import mark
from .models import Order, RunRecord


async def _acounted(marker: str, name: str, hold: float = 0.0) -> str:
    mark(marker, name)
    if hold:
        await asyncio.sleep(hold)
    return f"{name}-result"


@jobqueue.handler("adurable.three_steps", takes_context=True)
async def three_steps(ctx: jobqueue.AsyncJobContext, marker: str, hold: float = 0.0) -> list[str]:
    """Three async steps; on its first run the third holds `hold` seconds (the test kills it)."""
    one = await ctx.step("one", _acounted, marker, "one")
    two = await ctx.step("two", _acounted, marker, "two")
    three = await ctx.step("three", _acounted, marker, "three", hold if ctx.attempt == 1 else 0)
    return [one, two, three]


def _write_order(marker: str, number: str, hold: float) -> int:
    """Write an order, then (on the first run) hold the step's transaction open `hold` s."""
    pk = int(Order.objects.create(number=number).pk)
    mark(marker, "written")
    if hold:
        time.sleep(hold)
    return pk


@jobqueue.handler("adurable.writing_step", takes_context=True)
async def writing_step(
    ctx: jobqueue.AsyncJobContext, marker: str, number: str, hold: float = 0.0
) -> int:
    """A plain function's ORM write in an async handler's step (the test kills it inside)."""
    return int(
        await ctx.step("write", _write_order, marker, number, hold if ctx.attempt == 1 else 0)
    )


def _slow(marker: str, seconds: float) -> dict[str, float]:
    started = time.time()
    mark(marker, "in-step")
    time.sleep(seconds)  # a blocking call: it runs off the event loop
    mark(marker, "step-end")
    return {"started": started, "finished": time.time()}


@jobqueue.handler("adurable.slow_sync_step", takes_context=True)
async def slow_sync_step(
    ctx: jobqueue.AsyncJobContext, marker: str, seconds: float, after: int = 0
) -> Any:
    """A step whose plain function blocks for `seconds`, once `after` tickers have started."""
    while lines_of(marker).count("tick-start") < after:
        await asyncio.sleep(0.05)
    return await ctx.step("slow", _slow, marker, seconds)


@jobqueue.handler("adurable.ticker")
async def ticker(marker: str, seconds: float) -> dict[str, Any]:
    """Tick every 0.1 s on the loop for `seconds`; return the ticks' times (wall clock)."""
    mark(marker, "tick-start")
    ticks = [time.time()]
    while ticks[-1] - ticks[0] < seconds:
        await asyncio.sleep(0.1)
        ticks.append(time.time())
    mark(marker, "tick-end")
    return {"ticks": ticks}


@jobqueue.handler("adurable.sleeper", takes_context=True)
async def sleeper(ctx: jobqueue.AsyncJobContext, seconds: float) -> float:
    """Sleep durably for `seconds`; return how long the whole job took (wall clock)."""
    started = await ctx.step("started", time.time)
    await ctx.sleep(seconds)
    return float(time.time() - started)


@jobqueue.handler("adurable.waiter", takes_context=True)
async def waiter(ctx: jobqueue.AsyncJobContext, key: str, timeout: float | None = None) -> Any:
    """Wait durably for event `key`; return its payload, or "timed out"."""
    try:
        return {"payload": await ctx.wait_for_event(key, timeout=timeout)}
    except jobqueue.WaitTimeout:
        return "timed out"


@jobqueue.handler("adurable.spawn_and_wait", takes_context=True)
async def spawn_and_wait(ctx: jobqueue.AsyncJobContext, children: list[Any]) -> Any:
    """Spawn each [type, args] of `children`, then wait for them all."""
    spawned = [await ctx.spawn(type, args) for type, args in children]
    return {str(pk): result for pk, result in sorted((await ctx.wait_for(spawned)).items())}


@jobqueue.handler("adurable.record", takes_context=True)
async def record(ctx: jobqueue.AsyncJobContext, seconds: float = 0.0) -> None:
    """Wait `seconds` (not durably), keeping the run's start and end as a RunRecord."""
    started = time.time()
    await asyncio.sleep(seconds)
    await RunRecord.objects.acreate(
        job_id=ctx.job_id, attempt=ctx.attempt, worker_pid=os.getpid(), started=started,
        finished=time.time(),
    )  # fmt: skip


@jobqueue.handler("adurable.progressing", takes_context=True)
async def progressing(ctx: jobqueue.AsyncJobContext, steps: int, pause: float = 0.0) -> int:
    """Report progress `steps` times, `pause` seconds apart (faster than it is written)."""
    for n in range(1, steps + 1):
        await ctx.progress(n, steps, f"page {n} of {steps}")
        await asyncio.sleep(pause)
    return steps


# -- one pipeline, sync and async: the same records ---------------------------------------------


def _fetch(marker: str, page: int) -> dict[str, Any]:
    mark(marker, f"fetch{page}")
    return {"page": page, "items": (page, page + 1)}  # a tuple: comes back a list


async def _afetch(marker: str, page: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _fetch(marker, page)


def _save(number: str) -> str:
    return Order.objects.create(number=number).number


@jobqueue.handler("pipeline.sync", takes_context=True)
def pipeline(ctx: jobqueue.JobContext, marker: str, key: str) -> dict[str, Any]:
    """Every durable call of a sync handler: steps, progress, a sleep, an event, a child."""
    pages = [ctx.step("fetch", _fetch, marker, page) for page in range(2)]
    saved = ctx.step("save", _save, f"order-{key}")
    ctx.progress(1, 3, "fetched")
    ctx.sleep(30)
    payload = ctx.wait_for_event(key)
    child = ctx.spawn("durable.child", {"i": 3})
    results = ctx.wait_for([child])
    ctx.progress(3, 3, "done")
    return {"pages": pages, "saved": saved, "payload": payload, "child": results[child.pk]}


@jobqueue.handler("pipeline.async", takes_context=True)
async def apipeline(ctx: jobqueue.AsyncJobContext, marker: str, key: str) -> dict[str, Any]:
    """The same pipeline as "pipeline.sync", async (its fetches are async functions)."""
    pages = [await ctx.step("fetch", _afetch, marker, page) for page in range(2)]
    saved = await ctx.step("save", _save, f"order-{key}")
    await ctx.progress(1, 3, "fetched")
    await ctx.sleep(30)
    payload = await ctx.wait_for_event(key)
    child = await ctx.spawn("durable.child", {"i": 3})
    results = await ctx.wait_for([child])
    await ctx.progress(3, 3, "done")
    return {"pages": pages, "saved": saved, "payload": payload, "child": results[child.pk]}
