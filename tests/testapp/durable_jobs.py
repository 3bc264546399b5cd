"""Handlers of the durable jobs' tests (tests/durable/test_durable_*.py): steps, sleeps, events,
children, progress. Calls that must be counted across crashes append a line to a marker file
(a step's own writes roll back with it when its worker is killed)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.db import transaction

import django_jobqueue as jobqueue

from .models import Order, RunRecord


def mark(marker: str, line: str) -> None:
    """Append `line` (and this process's pid) to the file `marker`."""
    with Path(marker).open("a") as out:
        out.write(f"{line} {os.getpid()}\n")
        out.flush()
        os.fsync(out.fileno())


def lines(marker: str) -> list[str]:
    """The first word of each line of `marker` (the calls it saw)."""
    path = Path(marker)
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def _counted(marker: str, name: str, hold: float = 0.0) -> str:
    mark(marker, name)
    if hold:
        time.sleep(hold)
    return f"{name}-result"


@jobqueue.handler("durable.three_steps", takes_context=True)
def three_steps(ctx: jobqueue.JobContext, marker: str, hold: float = 0.0) -> list[str]:
    """Three steps; on its first run the third holds `hold` seconds (the test kills it)."""
    one = ctx.step("one", _counted, marker, "one")
    two = ctx.step("two", _counted, marker, "two")
    three = ctx.step("three", _counted, marker, "three", hold if ctx.attempt == 1 else 0.0)
    return [one, two, three]


@jobqueue.handler("durable.loop_steps", takes_context=True)
def loop_steps(ctx: jobqueue.JobContext, marker: str, pages: int, fail_at: int = 0) -> list[Any]:
    """One step per page, all named "page"; the first run fails after page `fail_at`."""
    out = []
    for page in range(pages):
        out.append(ctx.step("page", _page, marker, page))
        if page + 1 == fail_at and ctx.attempt == 1:
            raise RuntimeError(f"failing after page {page}")
    return out


def _page(marker: str, page: int) -> dict[str, Any]:
    mark(marker, f"page{page}")
    return {"page": page, "items": (page, page + 1)}  # a tuple: comes back a list


@jobqueue.handler("durable.writing_step", takes_context=True)
def writing_step(
    ctx: jobqueue.JobContext, number: str, fail: bool = False, fail_after: bool = False
) -> int:
    """A step that writes a row; on the first attempt, with `fail` it raises after the write
    (inside the step), with `fail_after` the handler raises after the step."""

    def write() -> int:
        order = Order.objects.create(number=number)
        if fail and ctx.attempt == 1:
            raise RuntimeError("after the write")
        return int(order.pk)

    pk = int(ctx.step("write", write))
    if fail_after and ctx.attempt == 1:
        raise RuntimeError("after the step")
    return pk


@jobqueue.handler("durable.bad_step", takes_context=True)
def bad_step(ctx: jobqueue.JobContext) -> None:
    ctx.step("unstorable", lambda: {1, 2})


@jobqueue.handler("durable.sleeper", takes_context=True)
def sleeper(ctx: jobqueue.JobContext, seconds: float, marker: str = "") -> float:
    """Sleep durably for `seconds`; return how long the whole job took (wall clock)."""
    started = ctx.step("started", time.time)
    if marker:
        mark(marker, "run")
    ctx.sleep(seconds)
    RunRecord.objects.create(
        job_id=ctx.job_id, attempt=ctx.attempt, worker_pid=os.getpid(), started=started,
        finished=time.time(),
    )  # fmt: skip
    return float(time.time() - started)


@jobqueue.handler("durable.waiter", takes_context=True)
def waiter(ctx: jobqueue.JobContext, key: str, timeout: float | None = None) -> Any:
    """Wait durably for event `key`; return its payload, or "timed out"."""
    try:
        return {"payload": ctx.wait_for_event(key, timeout=timeout)}
    except jobqueue.WaitTimeout:
        return "timed out"


@jobqueue.handler("durable.spawner", takes_context=True)
def spawner(
    ctx: jobqueue.JobContext, count: int, marker: str = "", hold: float = 0.0, wait: bool = True
) -> Any:
    """Spawn `count` children; on the first run hold `hold` seconds before waiting for them."""
    children = [ctx.spawn("durable.child", {"i": i, "marker": marker}) for i in range(count)]
    if hold and ctx.attempt == 1:
        if marker:
            mark(marker, "spawned")
        time.sleep(hold)
    if not wait:
        return [child.pk for child in children]
    try:
        results = ctx.wait_for(children)
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}
    return sorted(results.values())


@jobqueue.handler("durable.spawn_and_wait", takes_context=True)
def spawn_and_wait(
    ctx: jobqueue.JobContext, children: list[Any], queue: str = "", marker: str = "",
    hold: float = 0.0,
) -> Any:  # fmt: skip
    """Spawn each [type, args] of `children` (in `queue`), then wait for them all; on the
    first run, hold `hold` seconds between the spawns and the wait (the test kills it)."""
    options = {"queue": queue} if queue else {}
    spawned = [ctx.spawn(type, args, **options) for type, args in children]
    if marker:
        mark(marker, "spawned")
    if hold and ctx.attempt == 1:
        time.sleep(hold)
    return {str(pk): result for pk, result in sorted(ctx.wait_for(spawned).items())}


@jobqueue.handler("durable.spawn_by_keyword", takes_context=True)
def spawn_by_keyword(ctx: jobqueue.JobContext, both: bool = False) -> Any:
    """Spawn a child by `key=` and one by `type=` (enqueue()'s name), then wait for them;
    with `both`, name the key twice (refused)."""
    if both:
        ctx.spawn(key="durable.child", type="durable.child", args={"i": 9})
    children = [
        ctx.spawn(key="durable.child", args={"i": 1}),
        ctx.spawn(type="durable.child", args={"i": 2}),
    ]
    return sorted(ctx.wait_for(children).values())


@jobqueue.handler("durable.child_fails_waiter", takes_context=True)
def child_fails_waiter(ctx: jobqueue.JobContext) -> Any:
    """Spawn a child that fails for good and one that is done, then wait for both."""
    failing = ctx.spawn("durable.child", {"i": 1, "fail": True}, max_attempts=1)
    fine = ctx.spawn("durable.child", {"i": 2})
    try:
        ctx.wait_for([failing, fine])
    except jobqueue.UpstreamFailed as exc:
        return {"failed": str(exc)}
    return "all done"


@jobqueue.handler("durable.naps", takes_context=True)
def naps(ctx: jobqueue.JobContext, count: int, until: str = "") -> int:
    """Sleep `count` times (and, given `until`, once more until that ISO time); return how
    many runs it took (each run that suspends counts one, in a step)."""
    import datetime as dt

    for n in range(count):
        ctx.sleep(0.01)
        ctx.step(f"after-{n}", int, n)
    if until:
        ctx.sleep_until(dt.datetime.fromisoformat(until))
    return ctx.step("done", lambda: count)


@jobqueue.handler("durable.work_and_nap", takes_context=True)
def work_and_nap(ctx: jobqueue.JobContext, runs: int, work: float) -> int:
    """`runs` runs of `work` seconds each (a step: a replay does not redo it), a short
    durable sleep after each but the last."""
    for n in range(runs):
        ctx.step(f"work-{n}", time.sleep, work)
        if n + 1 < runs:
            ctx.sleep(0.05)
    return runs


@jobqueue.handler("durable.child", takes_context=True)
def child(ctx: jobqueue.JobContext, i: int, marker: str = "", fail: bool = False) -> int:
    if marker:
        mark(marker, f"child{i}")
    if fail:
        raise jobqueue.Fail(f"child {i} fails")
    return i * i


@jobqueue.handler("durable.progressing", takes_context=True)
def progressing(ctx: jobqueue.JobContext, steps: int, pause: float = 0.0) -> int:
    for n in range(1, steps + 1):
        ctx.progress(n, steps, f"page {n} of {steps}")
        if pause:
            time.sleep(pause)
    return steps


def send_in_transaction(key: str, payload: Any, rollback: bool) -> None:
    """Send event `key` inside a transaction that commits, or rolls back with `rollback`."""

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            jobqueue.send_event(key, payload)
            if rollback:
                raise Rollback
    except Rollback:
        pass


@jobqueue.handler("durable.budget_then_fail", takes_context=True)
def budget_then_fail(ctx: jobqueue.JobContext, fail_once: bool = False) -> dict[str, Any]:
    """Acquire and settle, then fail the first attempt: the second replays both."""
    grant = ctx.acquire("daily:2", 10)
    ctx.settle(grant, 5)
    grants = ctx.step("grants", lambda: [[grant.units, grant.granted_at.isoformat()]])
    if fail_once and ctx.attempt == 1:
        raise RuntimeError("once")
    return {"grants": [grants[0], [grant.units, grant.granted_at.isoformat()]]}
