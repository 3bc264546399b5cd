"""Handlers the tests enqueue; autodiscovered like any app's jobs.py."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import django_jobqueue as jobqueue

from .models import RunRecord


@jobqueue.handler("test.noop")
def noop() -> None:
    return None


@jobqueue.handler("test.add")
def add(a: int, b: int) -> int:
    return a + b


@jobqueue.handler("test.record", takes_context=True)
def record(ctx: jobqueue.JobContext, sleep: float = 0.0, value: Any = None) -> Any:
    started = time.time()
    if sleep:
        time.sleep(sleep)
    RunRecord.objects.create(
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        worker_pid=os.getpid(),
        started=started,
        finished=time.time(),
    )
    return value


@jobqueue.handler("test.fail")
def fail(message: str = "boom") -> None:
    raise RuntimeError(message)


@jobqueue.handler("test.fail_then_succeed", takes_context=True)
def fail_then_succeed(ctx: jobqueue.JobContext, failures: int) -> str:
    if ctx.attempt <= failures:
        raise RuntimeError(f"failing attempt {ctx.attempt}")
    return f"ok on attempt {ctx.attempt}"


@jobqueue.handler("test.retry_once", takes_context=True)
def retry_once(ctx: jobqueue.JobContext, delay: float = 0.0) -> int:
    if ctx.attempt == 1:
        raise jobqueue.Retry(delay=delay)
    return ctx.attempt


@jobqueue.handler("test.fail_hard")
def fail_hard() -> None:
    raise jobqueue.Fail("not worth retrying")


@jobqueue.handler("test.sleep")
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@jobqueue.handler("test.spin")
def spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@jobqueue.handler("test.async_add")
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@jobqueue.handler("test.async_sleep")
async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@jobqueue.handler("test.crash_once", takes_context=True)
def crash_once(ctx: jobqueue.JobContext, marker: str) -> str:
    """Kill the worker process on the first attempt, as a segfault or OOM kill would."""
    if not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os._exit(137)
    return "survived"


@jobqueue.handler("test.crash_always")
def crash_always() -> None:
    os._exit(137)


@jobqueue.handler("test.bad_result")
def bad_result() -> object:
    return object()


@jobqueue.handler("test.upstream_sum", takes_context=True)
def upstream_sum(ctx: jobqueue.JobContext) -> int:
    return sum(v for v in ctx.upstream_results.values() if isinstance(v, int))


from . import (  # noqa: E402
    signal_log,  # noqa: F401 - signal receivers, when the environment asks
    workflow_jobs,  # noqa: F401 - registers the workflow handlers
)
