"""Handlers for the workflow tests (imported by jobs.py so that they are registered)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import django_jobqueue as jobqueue

from .models import RunRecord


def _record(ctx: jobqueue.JobContext, started: float) -> None:
    RunRecord.objects.create(
        job_id=ctx.job_id,
        attempt=ctx.attempt,
        worker_pid=os.getpid(),
        started=started,
        finished=time.time(),
    )


@jobqueue.handler("wf.step", takes_context=True)
def step(ctx: jobqueue.JobContext, fail_until: int = 0, sleep: float = 0.0) -> dict[str, Any]:
    """One node of a test workflow: record the run, fail while attempt <= fail_until.

    The result names this job and what it saw of its upstream jobs ({id: their "me"}), so
    tests can check that ctx.upstream_results showed exactly the upstream jobs' results.
    """
    started = time.time()
    if sleep:
        time.sleep(sleep)
    seen = {
        str(pk): value.get("me") if isinstance(value, dict) else value
        for pk, value in ctx.upstream_results.items()
    }
    _record(ctx, started)
    if ctx.attempt <= fail_until:
        raise RuntimeError(f"failing attempt {ctx.attempt} of job {ctx.job_id} on purpose")
    return {"me": ctx.job_id, "up": seen}


@jobqueue.handler("wf.echo_upstream", takes_context=True)
def echo_upstream(ctx: jobqueue.JobContext) -> dict[str, Any]:
    """Return ctx.upstream_results with string keys (JSON object keys)."""
    return {str(pk): value for pk, value in ctx.upstream_results.items()}


@jobqueue.handler("wf.until_cancelled", takes_context=True)
def until_cancelled(ctx: jobqueue.JobContext, limit: float = 60.0) -> str:
    """Loop until the job's cancellation is requested; raise if that never happens.

    Its return value must be discarded by the queue (the job ends cancelled, result None); the
    error on the safety timeout would show up as last_error, which the tests rule out.
    """
    started = time.time()
    deadline = time.monotonic() + limit
    while not ctx.cancelled:
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {ctx.job_id} never saw its cancellation")
        time.sleep(0.05)
    _record(ctx, started)
    return "finished after seeing the cancellation"


def dynamic_limit(group: str) -> int | None:
    """A DYNAMIC_LIMIT hook: group "dyn" may run 1 job at a time, "capped" 3, others no cap."""
    return {"dyn": 1, "capped": 3}.get(group)


def stuck_limit(group: str) -> int | None:
    """A DYNAMIC_LIMIT hook that blocks the claim while the file JOBQUEUE_TEST_STUCK_FILE exists
    (at most a minute): the dispatcher of every worker using it is stuck meanwhile."""
    marker = Path(os.environ["JOBQUEUE_TEST_STUCK_FILE"])
    deadline = time.monotonic() + 60
    while marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return None
