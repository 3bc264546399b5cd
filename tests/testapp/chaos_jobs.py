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
    soak tolerates it (the attempt had touched the database). One of the first statement is
    noted with its time (`note_failure`): the soak tolerates it only while the server was
    going down, when the statement may have been running.
    """
    started = time.time()
    if sleep:
        time.sleep(sleep)
    try:
        RunRecord.objects.create(
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            worker_pid=os.getpid(),
            started=started,
            finished=time.time(),
        )
    except (OperationalError, InterfaceError):
        note_failure(ctx.job_id, ctx.attempt)
        raise
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


def note_failure(job_id: int, attempt: int) -> None:
    """Append when this attempt's first statement failed to the file named by
    JOBQUEUE_CHAOS_FAILURES, if any (one short line: appends of workers do not mix)."""
    path = os.environ.get("JOBQUEUE_CHAOS_FAILURES")
    if path:
        with open(path, "a") as out:
            out.write(f"{job_id} {attempt} {time.time():.3f}\n")
