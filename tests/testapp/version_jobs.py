"""Handlers of the tests of handler versions with worker processes
(tests/deploys/test_versions_workers.py).

What a process registers depends on its environment, as the code of a release would:
JOBQUEUE_TEST_REPORT_VERSIONS lists the versions of "versions.report" it has (default "1,2",
both, oldest first); JOBQUEUE_TEST_RELEASE says which code the handlers changed in place
have ("old", the default, or "new").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import django_jobqueue as jobqueue

REPORT_VERSIONS = os.environ.get("JOBQUEUE_TEST_REPORT_VERSIONS", "1,2").split(",")
NEW = os.environ.get("JOBQUEUE_TEST_RELEASE", "old") == "new"


def _report(version: str) -> Callable[..., Any]:
    def report(ctx: jobqueue.JobContext, sleep: float) -> dict[str, Any]:
        """Record which version began the job, sleep, say which version ended it and where."""
        first = ctx.step("first", lambda: version)
        ctx.sleep(sleep)
        return {"first": first, "version": version, "worker": ctx.worker_id}

    report.__qualname__ = f"report_v{version}"
    return report


for _version in ("1", "2"):
    if _version in REPORT_VERSIONS:
        jobqueue.handler("versions.report", takes_context=True, version=_version)(_report(_version))


@jobqueue.handler("versions.reorder", takes_context=True)
def reorder(ctx: jobqueue.JobContext, sleep: float) -> list[str]:
    """Steps a and b, then a sleep; the new release calls b before a."""
    order = ("b", "a") if NEW else ("a", "b")
    done = [ctx.step(name, lambda name=name: name) for name in order]
    ctx.sleep(sleep)
    return done


@jobqueue.handler("versions.patch", takes_context=True)
def patch_point(ctx: jobqueue.JobContext, sleep: float) -> dict[str, Any]:
    """A step (the point), then a sleep; the new release asks patched("x") before the point."""
    took = ctx.patched("x") if NEW else None
    ctx.step("a", lambda: "a")
    ctx.sleep(sleep)
    return {"patched": took}


# The same three as async handlers: their durable calls are awaited.


def _areport(version: str) -> Callable[..., Any]:
    async def report(ctx: jobqueue.AsyncJobContext, sleep: float) -> dict[str, Any]:
        """report, awaited."""
        first = await ctx.step("first", lambda: version)
        await ctx.sleep(sleep)
        return {"first": first, "version": version, "worker": ctx.worker_id}

    report.__qualname__ = f"areport_v{version}"
    return report


for _version in ("1", "2"):
    if _version in REPORT_VERSIONS:
        jobqueue.handler("versions.areport", takes_context=True, version=_version)(
            _areport(_version)
        )


@jobqueue.handler("versions.areorder", takes_context=True)
async def areorder(ctx: jobqueue.AsyncJobContext, sleep: float) -> list[str]:
    """reorder, awaited."""
    order = ("b", "a") if NEW else ("a", "b")
    done = [await ctx.step(name, lambda name=name: name) for name in order]
    await ctx.sleep(sleep)
    return done


@jobqueue.handler("versions.apatch", takes_context=True)
async def apatch_point(ctx: jobqueue.AsyncJobContext, sleep: float) -> dict[str, Any]:
    """patch_point, awaited."""
    took = await ctx.patched("x") if NEW else None
    await ctx.step("a", lambda: "a")
    await ctx.sleep(sleep)
    return {"patched": took}
