"""Handlers for the chaos suite (tests/chaos/), imported by jobs.py so that they are registered."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import InterfaceError, OperationalError, connection

import django_jobqueue as jobqueue

from .models import RunRecord


class LostMidJob(Exception):
    """The server went away after the attempt's first statement, which had succeeded."""


@jobqueue.handler("chaos.step", takes_context=True)
def chaos_step(
    ctx: jobqueue.JobContext,
    n: int = 0,
    sleep: float = 0.0,
    fail: bool = False,
    flaky: bool = False,
) -> dict[str, Any]:
    """Record this run, then fail for good (`fail`), fail on the first run only (`flaky`), or
    return a result naming the attempt and the process that produced it.

    The run record is committed before the outcome, so a worker killed in between leaves the
    record of a run whose outcome was never written: the re-runs the suite counts. Records are
    unique per (job, attempt), so an attempt that ran twice would fail with an IntegrityError.

    A connection error after the first statement is raised as LostMidJob: the server restart
    suite tolerates it (the attempt had touched the database), but not a connection error
    of the first statement, which the worker must hand back uncharged.
    """
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
    if fail:
        raise jobqueue.Fail(f"job {ctx.job_id} fails for good on purpose")
    try:
        if flaky and RunRecord.objects.filter(job_id=ctx.job_id).count() == 1:
            raise RuntimeError(f"job {ctx.job_id} fails its first run on purpose")
        upstream = ctx.upstream_results
    except (OperationalError, InterfaceError) as exc:
        raise LostMidJob(f"after the first statement: {exc}") from exc
    return {
        "n": n,
        "attempt": ctx.attempt,
        "pid": os.getpid(),
        # What it saw of each upstream result: the generation and process that produced it.
        "up": {
            str(pk): [value["attempt"], value["pid"]] if isinstance(value, dict) else value
            for pk, value in upstream.items()
        },
    }


@jobqueue.handler("chaos.cannot_connect_once", takes_context=True)
def cannot_connect_once(ctx: jobqueue.JobContext) -> int:
    """On the first attempt, fail to connect as during a server outage: the thread's connection
    is closed and reopening it fails; the next attempt runs normally."""
    if ctx.attempt == 1:
        connection.close()

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise connection.Database.OperationalError(2002, "Can't connect (chaos)")

        connection.get_new_connection = refuse  # type: ignore[method-assign]
        try:
            connection.ensure_connection()
        finally:
            del connection.get_new_connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return ctx.attempt
