"""Workflows against independent jobs: the same number of no-op jobs drained as independent
jobs, as a DAG with fan-in, and as the children of one container.

`BENCH_DB=pg python -m bench.workflows [--jobs 10000] [--workers 2] [--concurrency 8]`

- independent: N jobs with no edges;
- dag: N/10 diamonds: a job, 8 jobs that depend on it, a job that depends on those 8;
- container: one container of N/2 children, and a job that depends on the container.
Each reports the drain rate (jobs/s from the first job done to the last, so that worker
start-up does not count), and the DAG and container rates as a ratio of the independent one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from . import harness


def independent(n: int) -> int:
    import django_jobqueue as jobqueue

    jobqueue.enqueue_many([("bench.noop", {})] * n)
    return n


def dag(n: int) -> int:
    import django_jobqueue as jobqueue

    with jobqueue.graph() as g:
        for _ in range(n // 10):
            top = g.add("bench.noop")
            middle = [g.add("bench.noop", depends_on=[top]) for _ in range(8)]
            g.add("bench.noop", depends_on=middle)
    return n // 10 * 10


def container(n: int) -> int:
    import django_jobqueue as jobqueue

    with jobqueue.graph() as g:
        box = g.container("batch")
        for _ in range(n // 2):
            g.add("bench.noop", parent=box)
        g.add("bench.noop", depends_on=[box])
    return n // 2 + 1


def run(build: Callable[[int], int], n: int, workers: int, args: list[str]) -> dict[str, float]:
    """Drain what `build` enqueues; the rate counts from the first job done (no start-up)."""
    from django.db import transaction

    from django_jobqueue.models import Job

    harness.reset()
    with transaction.atomic():
        jobs = build(n)
    harness.analyze()
    unfinished = Job.objects.exclude(state__in=Job.TERMINAL_STATES)
    procs = harness.start_workers(workers, args)
    try:
        harness.wait_until(lambda: Job.objects.filter(state="done").exists(), 120, 0.005)
        started = time.perf_counter()
        first = Job.objects.filter(state="done").count()
        harness.wait_until(lambda: not unfinished.exists(), 900)
        took = time.perf_counter() - started
    finally:
        harness.stop_workers(procs)
    assert Job.objects.exclude(state="done").count() == 0
    return {"jobs": jobs, "seconds": took, "jobs_per_s": (jobs - first) / took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency)]
    base = run(independent, opts.jobs, opts.workers, args)
    harness.report("workflows", {"shape": "independent", **base})
    for name, build in (("dag", dag), ("container", container)):
        figures = run(build, opts.jobs, opts.workers, args)
        figures["rate_vs_independent"] = figures["jobs_per_s"] / base["jobs_per_s"]
        harness.report("workflows", {"shape": name, **figures})


if __name__ == "__main__":
    main()
