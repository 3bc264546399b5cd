"""Handlers of the budgets' tests (tests/limits/test_budgets*.py): units taken while a job runs
(`ctx.acquire`) and settled by what was used (`ctx.settle`)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import django_jobqueue as jobqueue


def _note(marker: str | None, line: str) -> None:
    if marker:
        with Path(marker).open("a") as out:
            out.write(line + "\n")


@jobqueue.handler("budgets.calls", takes_context=True)
def calls(
    ctx: jobqueue.JobContext,
    resource: str = "tokens",
    calls: int = 1,
    estimate: int = 10,
    used: int | None = None,
    spread: bool = False,
    marker: str | None = None,
    hold: float = 0.0,
    hold_after: float = 0.0,
) -> list[dict[str, Any]]:
    """`calls` simulated model calls: each takes `estimate` units, "calls the model", and
    settles what it used (`used`, or at random at or below the estimate with `spread`)."""
    done = []
    for n in range(calls):
        grant = ctx.acquire(resource, estimate)
        _note(marker, f"granted {n}")
        if hold:
            time.sleep(hold)  # a worker killed here: between the grant and its settlement
        spent = used if used is not None else estimate
        if spread:
            spent = random.Random(f"{ctx.job_id}:{n}").randint(1, estimate)
        ctx.settle(grant, spent)
        _note(marker, f"settled {n}")
        if hold_after:
            time.sleep(hold_after)  # killed here: a settlement that gives back, not written yet
        done.append({"units": grant.units, "at": grant.granted_at.isoformat(), "used": spent})
    return done


@jobqueue.handler("budgets.settle_uses", takes_context=True, uses={"tokens": 50})
def settle_uses(ctx: jobqueue.JobContext, used: int) -> int:
    """A job whose `uses` took 50 tokens at its claim, settling what it used."""
    ctx.settle("tokens", used)
    return used


@jobqueue.handler("budgets.acquire", takes_context=True)
def acquire_only(ctx: jobqueue.JobContext, resource: str, units: Any) -> Any:
    """One acquire, as given (bad input included)."""
    grant = ctx.acquire(resource, units)
    return grant.units


@jobqueue.handler("budgets.acalls", takes_context=True)
async def acalls(
    ctx: jobqueue.AsyncJobContext,
    resource: str = "tokens",
    calls: int = 1,
    estimate: int = 10,
    used: int | None = None,
    spread: bool = False,
    marker: str | None = None,
    hold: float = 0.0,
    hold_after: float = 0.0,
) -> list[dict[str, Any]]:
    """`budgets.calls` in an async handler: each simulated model call awaits its grant, its
    call (an async step) and its settlement."""
    import asyncio

    done = []
    for n in range(calls):
        grant = await ctx.acquire(resource, estimate)
        _note(marker, f"granted {n}")
        if hold:
            await asyncio.sleep(hold)  # a worker killed here: between the grant and its settlement
        spent = used if used is not None else estimate
        if spread:
            spent = random.Random(f"{ctx.job_id}:{n}").randint(1, estimate)
        await ctx.step("call", asyncio.sleep, 0.001)
        await ctx.settle(grant, spent)
        _note(marker, f"settled {n}")
        if hold_after:
            await asyncio.sleep(hold_after)  # killed here: a give-back not written yet
        done.append({"units": grant.units, "at": grant.granted_at.isoformat(), "used": spent})
    return done


@jobqueue.handler("budgets.settle_then_rolled_back_step", takes_context=True)
def settle_then_rolled_back_step(ctx: jobqueue.JobContext) -> str:
    """A give-back settled, then a step inside the handler's own transaction, which it rolls
    back and carries on: the settlement must not share that transaction's fate."""
    from django.db import transaction

    grant = ctx.acquire("daily:atomic", 10)
    ctx.settle(grant, 4)  # gives 6 back: written with the job's next write
    try:
        with transaction.atomic():
            ctx.step("save", lambda: "saved")
            raise RuntimeError("the handler's transaction rolls back")
    except RuntimeError:
        pass
    return "carried on"
