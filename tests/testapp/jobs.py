"""Handlers the tests enqueue; autodiscovered like any app's jobs.py."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from decimal import Decimal
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


# The event loops async jobs of this process ran on (kept alive, so each counts once).
_loops_seen: set[asyncio.AbstractEventLoop] = set()


@jobqueue.handler("test.async_where")
async def async_where(seconds: float = 0.0) -> dict[str, Any]:
    """Say where this async job ran: its thread, how many loops, and when (wall clock)."""
    started = time.time()
    loop = asyncio.get_running_loop()
    _loops_seen.add(loop)
    await asyncio.sleep(seconds)
    return {
        "thread": threading.current_thread().name,
        "loops": len(_loops_seen),
        "started": started,
        "finished": time.time(),
    }


@jobqueue.handler("test.async_block")
async def async_block(seconds: float) -> None:
    """Block the event loop (a sync call in a coroutine), for the worker to time out."""
    time.sleep(seconds)


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


@jobqueue.handler("test.hold_gil")
def hold_gil(length: int = 32) -> bool:
    """Freeze the whole process for minutes: a catastrophic regex holds the GIL throughout."""
    return re.match(r"(a+)+b", "a" * length) is not None


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (dead, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@jobqueue.handler("test.overlap_probe", takes_context=True)
def overlap_probe(ctx: jobqueue.JobContext, first_sleep: float = 0.0) -> list[int]:
    """Record this run's start; return the pids of earlier runs of the job still alive."""
    RunRecord.objects.create(
        job_id=ctx.job_id, attempt=ctx.attempt, worker_pid=os.getpid(), started=time.time()
    )
    earlier = RunRecord.objects.filter(job_id=ctx.job_id, attempt__lt=ctx.attempt)
    alive = [pid for pid in earlier.values_list("worker_pid", flat=True) if _alive(pid)]
    if ctx.attempt == 1:
        time.sleep(first_sleep)
    return alive


@jobqueue.handler("test.upstream_sum", takes_context=True)
def upstream_sum(ctx: jobqueue.JobContext) -> int:
    return sum(v for v in ctx.upstream_results.values() if isinstance(v, int))


from . import (  # noqa: E402
    admin_jobs,  # noqa: F401 - registers the admin tests' handlers
    async_durable_jobs,  # noqa: F401 - registers the async durable jobs' handlers
    budget_jobs,  # noqa: F401 - registers the budgets' handlers
    chaos_jobs,  # noqa: F401 - registers the chaos suite's handlers
    connection_jobs,  # noqa: F401 - registers the handlers of the connection tests
    durable_jobs,  # noqa: F401 - registers the durable jobs' handlers
    fanout_jobs,  # noqa: F401 - registers the fan-out tests' handlers
    limit_jobs,  # noqa: F401 - registers the quota limits' handlers
    log_jobs,  # noqa: F401 - registers the job log lines' handlers
    name_jobs,  # noqa: F401 - registers the bad names' handlers
    otel_jobs,  # noqa: F401 - registers the telemetry tests' handlers
    sequence_jobs,  # noqa: F401 - registers the sequences' handlers
    signal_log,  # noqa: F401 - signal receivers, when the environment asks
    testing_jobs,  # noqa: F401 - registers the handlers of the testing helpers' tests
    version_jobs,  # noqa: F401 - registers the handler versions' handlers
    workflow_jobs,  # noqa: F401 - registers the workflow handlers
)


@jobqueue.handler("test.unstorable_result")
def unstorable_result(kind: str = "nul") -> object:
    """A JSON result that no database stores as it is (or one over the size limit)."""
    return {"nul": "a\x00b", "surrogate": "a\ud800b", "big": "x" * 2_000_000}[kind]


@jobqueue.handler("test.nasty_error")
def nasty_error() -> None:
    """Fail with a message no database stores as it is, and far too long."""
    raise RuntimeError("bad\x00byte \udc80 " + "y" * 100_000)


if os.environ.get("JOBQUEUE_TEST_NEW_RELEASE"):
    # A handler that only the "new release" of a rolling deploy has.

    @jobqueue.handler("test.new_release")
    def new_release() -> str:
        return "new"


class _SlowToCheck(dict[str, Any]):
    """A result whose check by the worker says it has begun, then takes a second."""

    marker = ""

    def items(self) -> Any:  # the worker's result check reads the items: it runs after return
        if not Path(self.marker).exists():
            Path(self.marker).write_text("checking")
            time.sleep(1.0)
        return super().items()


class _Unreadable(dict[str, Any]):
    def items(self) -> Any:
        raise RuntimeError("dictionary changed size during iteration")


@jobqueue.handler("test.unreadable_result")
def unreadable_result() -> dict[str, Any]:
    """Return a result that raises when the worker checks it (a dict another thread changes)."""
    return _Unreadable(a=1)


@jobqueue.handler("test.slow_to_check")
def slow_to_check(marker: str) -> dict[str, Any]:
    """Return a result that takes the worker a second to check; the marker says it began.

    The marker is written by the check itself, after the handler has returned, so that however
    loaded the machine, a test that waits for it stops the worker while the check runs.
    """
    result = _SlowToCheck(checked=True)
    result.marker = marker
    return result


# The bad Retry arguments a handler might pass: checked where Retry is raised.
BAD_RETRIES: dict[str, dict[str, Any]] = {
    "at_text": {"at": "tomorrow"},
    "at_int": {"at": 12345},
    "delay_decimal": {"delay": Decimal("5")},
}


@jobqueue.handler("test.bad_retry")
def bad_retry(kind: str, forced: bool = False) -> None:
    """Raise Retry with a bad argument; `forced` sets it past Retry's checks (a subclass might)."""
    if not forced:
        raise jobqueue.Retry(**BAD_RETRIES[kind])
    retry = jobqueue.Retry(reason=f"forced {kind}")
    for name, value in BAD_RETRIES[kind].items():
        setattr(retry, name, value)
    raise retry


@jobqueue.handler("test.loud_error")
def loud_error(kind: str) -> None:
    """Fail with a message meant to flood or forge log lines, or that cannot even be shown."""
    if kind == "long":
        raise RuntimeError("x" * 1_000_000)
    if kind == "lines":
        raise RuntimeError("first\n" + "Job id=1 type=test.add attempt=1 done\n" * 1000)
    raise BrokenStr()


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@jobqueue.handler("test.deep_result")
def deep_result(levels: int) -> list[Any]:
    """Return `levels` nested arrays (MariaDB's JSON_VALID refuses 32 or more)."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@jobqueue.handler("test.async_orm_threads")
async def async_orm_threads(seconds: float = 1.0) -> dict[str, Any]:
    """Say which threads ran this job's thread-sensitive (ORM) calls, before and after a wait."""
    from asgiref.sync import sync_to_async

    from django_jobqueue.models import Job

    def where() -> dict[str, Any]:
        Job.objects.exists()  # a query, on that thread's connection
        return {"ident": threading.get_ident(), "name": threading.current_thread().name}

    before = await sync_to_async(where, thread_sensitive=True)()
    await asyncio.sleep(seconds)
    after = await sync_to_async(where, thread_sensitive=True)()
    return {"before": before, "after": after}


# The handlers of this process running now, sync and async together (test.count_running*).
_running = 0
_running_lock = threading.Lock()


def _enter_running() -> int:
    global _running
    with _running_lock:
        _running += 1
        return _running


def _leave_running() -> None:
    global _running
    with _running_lock:
        _running -= 1


@jobqueue.handler("test.count_running_async")
async def count_running_async(seconds: float = 0.01) -> int:
    """Return how many handlers of this process were running as this one started, itself
    included (the largest of these over a run is the most that ran at once)."""
    running = _enter_running()
    try:
        await asyncio.sleep(seconds)
    finally:
        _leave_running()
    return running


@jobqueue.handler("test.count_running_sync")
def count_running_sync(seconds: float = 0.01) -> int:
    """test.count_running_async's sync twin, counted with it."""
    running = _enter_running()
    try:
        time.sleep(seconds)
    finally:
        _leave_running()
    return running
