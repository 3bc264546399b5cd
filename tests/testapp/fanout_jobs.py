"""Handlers of the fan-out tests (tests/test_fanout*.py): waits for the first N of many jobs."""

from __future__ import annotations

import time
from typing import Any

import django_jobqueue as jobqueue
from django_jobqueue.models import Job

from .durable_jobs import mark


def _answer(results: dict[int, Any], spawned: list[int]) -> dict[str, Any]:
    return {
        "results": {str(pk): result for pk, result in sorted(results.items())},
        "spawned": spawned,
    }


@jobqueue.handler("fanout.race", takes_context=True)
def race(
    ctx: jobqueue.JobContext,
    children: list[Any],
    count: int | None = None,
    first: bool = False,
    cancel_rest: bool = False,
    marker: str = "",
    fail_after: bool = False,
) -> Any:
    """Spawn each [type, args, options] of `children`, then wait for the first of them (`first`),
    `count` of them, or all; on the first attempt, with `fail_after`, fail after the wait."""
    spawned = [ctx.spawn(type, args, **options) for type, args, options in children]
    try:
        if first:
            results = ctx.wait_for_any(spawned, cancel_rest=cancel_rest)
        else:
            results = ctx.wait_for(spawned, count=count, cancel_rest=cancel_rest)
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc), "spawned": [child.pk for child in spawned]}
    answer = _answer(results, [child.pk for child in spawned])
    if marker:  # how the children stood when the wait returned (read, not recorded)
        mark(marker, "returned")
        states = Job.objects.filter(pk__in=answer["spawned"]).values_list("pk", "state")
        answer["states_then"] = {str(pk): state for pk, state in states}
    if fail_after and ctx.attempt == 1:
        raise RuntimeError("after the wait")
    return answer


@jobqueue.handler("afanout.race", takes_context=True)
async def arace(
    ctx: jobqueue.AsyncJobContext,
    children: list[Any],
    count: int | None = None,
    first: bool = False,
    cancel_rest: bool = False,
) -> Any:
    """`fanout.race` as an async handler: its durable calls are awaited."""
    spawned = [await ctx.spawn(type, args, **options) for type, args, options in children]
    try:
        if first:
            results = await ctx.wait_for_any(spawned, cancel_rest=cancel_rest)
        else:
            results = await ctx.wait_for(spawned, count=count, cancel_rest=cancel_rest)
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc), "spawned": [child.pk for child in spawned]}
    return _answer(results, [child.pk for child in spawned])


@jobqueue.handler("fanout.any_then_event", takes_context=True)
def any_then_event(ctx: jobqueue.JobContext, ids: list[int], key: str) -> Any:
    """Wait for the first of jobs `ids` (not its children), then for event `key`."""
    first = ctx.wait_for_any(ids)
    payload = ctx.wait_for_event(key)
    return {"first": sorted(first), "payload": payload}


@jobqueue.handler("fanout.sleep")
def sleep(seconds: float) -> float:
    """Hold the worker's thread `seconds` seconds (time.sleep), then return them."""
    time.sleep(seconds)
    return seconds
