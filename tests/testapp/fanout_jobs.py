"""Handlers of the fan-out tests (tests/workflows/test_fanout*.py,
tests/workflows/test_map*.py): waits for the first N of many jobs, maps."""

from __future__ import annotations

import time
from typing import Any

import django_jobqueue as jobqueue
from django_jobqueue.models import Job

from .durable_jobs import lines, mark


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


# -- ctx.map -------------------------------------------------------------------------------------


@jobqueue.handler("map.parent", takes_context=True)
def map_parent(
    ctx: jobqueue.JobContext,
    items: list[Any],
    key: str = "map.square",
    concurrency: int | None = None,
    options: dict[str, Any] | None = None,
    marker: str = "",
    fail_after: bool = False,
) -> Any:
    """Map `key` over `items`; return the results, or the UpstreamFailed message. With
    `fail_after`, the first attempt fails after the map."""
    if marker:
        mark(marker, "run")
    try:
        results = ctx.map(key, items, concurrency=concurrency, **(options or {}))
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}
    if fail_after and ctx.attempt == 1:
        raise RuntimeError("after the map")
    return {"results": results}


@jobqueue.handler("amap.parent", takes_context=True)
async def amap_parent(
    ctx: jobqueue.AsyncJobContext,
    items: list[Any],
    key: str = "map.square",
    concurrency: int | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """`map.parent` as an async handler: its map is awaited."""
    try:
        results = await ctx.map(key, items, concurrency=concurrency, **(options or {}))
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}
    return {"results": results}


@jobqueue.handler("map.square")
def square(item: Any = None, x: int = 0, fail: bool = False) -> Any:
    """item * item (an item that is not a dict), else x * x; raise with `fail`."""
    if fail:
        raise RuntimeError(f"child {x} fails")
    return item * item if item is not None else x * x


@jobqueue.handler("map.tracked")
def tracked(item: int, marker: str = "", hold: float = 0.05) -> int:
    """Append "S item" when it starts and "E item" when it ends to `marker`; return item * 2.

    The lines of one file are in the order the processes wrote them (appends), so counting
    S up and E down over them gives how many ran at each instant."""
    mark(marker, f"S{item}")
    time.sleep(hold)
    mark(marker, f"E{item}")
    return item * 2


@jobqueue.handler("map.killable", takes_context=True)
def killable(
    ctx: jobqueue.JobContext, count: int, concurrency: int, marker: str, hold: float = 0.05
) -> Any:
    """Map `map.tracked` over range(count); on the first attempt, stop for 60 s inside the
    map's transaction, after its first INSERT of children (say "spawning" in `marker`), so
    that the test can kill the worker there."""
    from django.db import connection

    stalls = [ctx.attempt == 1 and "spawning" not in lines(marker)]

    def stall(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if stalls[0] and "INSERT" in sql.upper():
            stalls[0] = False
            mark(marker, "spawning")
            time.sleep(60)
        return result

    items = [{"item": i, "marker": marker, "hold": hold} for i in range(count)]
    mark(marker, "run")
    with connection.execute_wrapper(stall):
        results = ctx.map("map.tracked", items, concurrency=concurrency)
    return {"results": results}


@jobqueue.handler("fanout.wait_downstream", takes_context=True)
def wait_downstream(ctx: jobqueue.JobContext) -> Any:
    """Spawn a child that dies and one downstream of it; wait for the downstream one only
    (which the first's death cancels, a cascade)."""
    doomed = ctx.spawn("durable.child", {"i": 1, "fail": True}, max_attempts=1)
    below = ctx.spawn("durable.child", {"i": 2}, depends_on=[doomed])
    try:
        return ctx.wait_for([below])
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}


@jobqueue.handler("fanout.wait_ids", takes_context=True)
def wait_ids(ctx: jobqueue.JobContext, ids: list[int]) -> Any:
    """Wait for jobs `ids`; return their results or the UpstreamFailed message."""
    try:
        return {str(pk): result for pk, result in ctx.wait_for(ids).items()}
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}
