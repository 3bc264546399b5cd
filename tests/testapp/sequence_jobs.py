"""Handlers of the sequences' tests (tests/workflows/test_sequences*.py): each run of a job writes
"start <n>" and "end <n>" to a marker file, so a test reads the order the runs came in and
whether two overlapped."""

from __future__ import annotations

import time

import django_jobqueue as jobqueue

from .durable_jobs import mark


@jobqueue.handler("seq.step", takes_context=True)
def step(
    ctx: jobqueue.JobContext,
    n: int,
    marker: str,
    fail_once: bool = False,
    fail_always: bool = False,
    sleep: float = 0.0,
    work: float = 0.0,
    hang_once: float = 0.0,
) -> int:
    """Job number `n` of a sequence: fails its first attempt (`fail_once`) or every one, or
    sleeps durably for `sleep` seconds, around `work` seconds of work (and `hang_once` more
    in its first attempt, for a test to kill its worker in)."""
    mark(marker, f"start {n}")
    try:
        if work or (hang_once and ctx.attempt == 1):
            time.sleep(work + (hang_once if ctx.attempt == 1 else 0.0))
        if fail_always or (fail_once and ctx.attempt == 1):
            raise RuntimeError(f"job {n} fails")
        if sleep:
            ctx.sleep(sleep)
        return n
    finally:
        mark(marker, f"end {n}")
