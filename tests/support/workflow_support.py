"""Helpers shared by the tests that run workflows with burst workers or worker processes
(tests/workflows/, tests/limits/ and others)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from django_jobqueue.models import Job
from django_jobqueue.worker import JobWorker, WorkerOptions
from tests.testapp.models import RunRecord

FAST = ("--poll-interval", "0.05")


def run_burst(concurrency: int = 2, **options: Any) -> int:
    """Run an in-process worker until nothing is left to do; return its exit code."""
    worker = JobWorker(WorkerOptions(concurrency=concurrency, burst=True, **options))
    return worker.run(install_signals=False)


def drain(concurrency: int = 2, timeout: float = 60.0) -> None:
    """Run burst workers until no job is ready (even later, after a retry backoff) or leased.

    A burst worker stops when nothing is claimable now, so one burst leaves a job that is
    waiting out its retry backoff behind.
    """
    deadline = time.monotonic() + timeout
    pending = Job.objects.filter(
        state__in=[Job.State.SCHEDULED, Job.State.READY, *Job.LEASED_STATES]
    )
    run_burst(concurrency)
    while pending.exists():
        assert time.monotonic() < deadline, list(pending.values_list("pk", "state"))
        time.sleep(0.02)
        run_burst(concurrency)


def states(*jobs: Job) -> tuple[str, ...]:
    """Refresh `jobs` from the database and return their states."""
    for job in jobs:
        job.refresh_from_db()
    return tuple(str(job.state) for job in jobs)


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Return the largest number of (start, end) intervals that overlap at one instant.

    An interval ending at the instant another starts does not overlap it (ends sort first).
    """
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    current = best = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


def run_intervals(**job_filter: Any) -> list[tuple[float, float]]:
    """The (started, finished) handler times of the runs of the jobs matching `job_filter`."""
    ids = list(Job.objects.filter(**job_filter).values_list("pk", flat=True))
    return list(RunRecord.objects.filter(job_id__in=ids).values_list("started", "finished"))


def limits_env(**limits: dict[str, int]) -> dict[str, str]:
    """The environment that gives worker subprocesses JOBQUEUE limits (see tests/settings.py)."""
    return {f"JOBQUEUE_TEST_{name.upper()}": json.dumps(value) for name, value in limits.items()}


def wipe() -> None:
    """Delete every job and run record (between examples of one transactional test)."""
    RunRecord.objects.all().delete()
    Job.objects.all().delete()
