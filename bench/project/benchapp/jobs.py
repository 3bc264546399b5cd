"""The benchmark's handlers, autodiscovered by django_jobqueue."""

import asyncio
import os
import time

import django_jobqueue as jobqueue

if os.environ.get("BENCH_REPLAY_CHECK") == "0":  # bench/replay_check.py's "before" workers
    from django_jobqueue.engine import replay

    replay._CHECK_PLACES = False


@jobqueue.handler("bench.noop")
def noop():
    return None


@jobqueue.handler("bench.async_sleep")
async def async_sleep(seconds=1.0):
    await asyncio.sleep(seconds)


@jobqueue.handler("bench.sleep")
def sleep(seconds=0.02):
    time.sleep(seconds)


@jobqueue.handler("bench.steps", takes_context=True)
def steps(ctx, count=20, seconds=0.1, durable=True):
    """`count` pieces of work of `seconds` each: as durable steps, or plain calls."""
    for n in range(count):
        if durable:
            ctx.step("piece", time.sleep, seconds)
        else:
            time.sleep(seconds)
        ctx.progress(n + 1, count)


@jobqueue.handler("bench.async_steps", takes_context=True)
async def async_steps(ctx, count=3, seconds=0.05):
    """`count` durable steps that each await asyncio.sleep(`seconds`) (an async handler)."""
    for _ in range(count):
        await ctx.step("wait", asyncio.sleep, seconds)


@jobqueue.handler("bench.sync_steps", takes_context=True)
def sync_steps(ctx, count=3, seconds=0.05):
    """`count` durable steps that each time.sleep(`seconds`) (the sync twin of async_steps)."""
    for _ in range(count):
        ctx.step("wait", time.sleep, seconds)


@jobqueue.handler("bench.replayed_steps", takes_context=True)
def replayed_steps(ctx, count=20, seconds=0.01):
    """`count` no-op durable steps, then a sleep of `seconds`: the run after it replays them."""
    for n in range(count):
        ctx.step("piece", int, n)
    ctx.sleep(seconds)


@jobqueue.handler("bench.sleep_once", takes_context=True)
def sleep_once(ctx, seconds=0.05):
    """Suspend once for `seconds` (a durable sleep), then finish."""
    ctx.sleep(seconds)


def _event_key():
    import uuid

    return f"bench-{uuid.uuid4().hex}"


@jobqueue.handler("bench.orm_io")
def orm_io(seconds=0.05):
    """One ORM read, one ORM write and a wait: issue 21's job, sync."""
    from django_jobqueue.models import JobEvent

    JobEvent.objects.filter(key="bench-none").first()
    JobEvent.objects.create(key=_event_key())
    time.sleep(seconds)


@jobqueue.handler("bench.async_orm_io")
async def async_orm_io(seconds=0.05):
    """The same through the async ORM (aget/acreate) and an asyncio wait."""
    from django_jobqueue.models import JobEvent

    await JobEvent.objects.filter(key="bench-none").afirst()
    await JobEvent.objects.acreate(key=_event_key())
    await asyncio.sleep(seconds)


@jobqueue.handler("bench.budget_calls", takes_context=True)
async def budget_calls(ctx, calls=10, estimate=100, resource="tokens"):
    """`calls` simulated model calls: each takes `estimate` units, awaits a 1 ms call (a step)
    and settles a random 1 to `estimate` of them (the same for every run of a job)."""
    import random

    used = 0
    for n in range(calls):
        grant = await ctx.acquire(resource, estimate)
        await ctx.step("call", asyncio.sleep, 0.001)
        spent = random.Random(f"{ctx.job_id}:{n}").randint(1, estimate)
        await ctx.settle(grant, spent)
        used += spent
    return used


@jobqueue.handler("bench.map", takes_context=True)
def map_noop(ctx, count=20000, concurrency=None):
    """Map bench.noop over `count` items (empty keyword arguments); return how many results."""
    return len(ctx.map("bench.noop", [{}] * count, concurrency=concurrency))
