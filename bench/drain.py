"""Drain N no-op jobs with W worker processes; report the steady rate and the peak RSS.

`BENCH_DB=pg python -m bench.drain [--jobs 10000] [--workers 2] [--concurrency 8]`

`--group g` puts the jobs in group g and `--uses '{"api": 1}'` gives them `uses`; with
BENCH_GROUP_LIMITS, BENCH_RATE_LIMITS or BENCH_LIMITS (JSON, see bench/project/settings.py)
the drain runs under those limits (issue 47's before-and-after runs).
"""

from __future__ import annotations

import argparse
import json
import time

from . import harness


def drain(
    jobs: int, workers: int, args: list[str], group: str = "", uses: dict | None = None
) -> dict[str, float | None]:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    spec: dict = {"type": "bench.noop", "group": group, **({"uses": uses} if uses else {})}
    with transaction.atomic():
        jobqueue.enqueue_many([spec] * jobs)
    harness.analyze()
    started = time.perf_counter()
    procs = harness.start_workers(workers, args)
    rss: list[float] = []
    first = None
    try:
        while (done := harness.done_count()) < jobs:
            now = time.perf_counter()
            if done and first is None:
                first = (now, done, harness.cpu_seconds(procs))
            if now - started > 600:
                raise TimeoutError(f"{done}/{jobs} done after 600 s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited early (see .bench-state/workers.log)")
            time.sleep(0.02)
        end = time.perf_counter()
        cpu = harness.cpu_seconds(procs)
        rss = [r for p in procs if (r := harness.peak_rss_mb(p)) is not None]
    finally:
        harness.stop_workers(procs)
    assert first is not None
    return {
        "jobs": jobs,
        "workers": workers,
        "args": " ".join(args),
        "jobs_per_s": jobs / (end - started),
        "steady_jobs_per_s": (jobs - first[1]) / (end - first[0]) if end > first[0] else None,
        "startup_s": first[0] - started,
        # The workers' CPU (user + system, every thread) per job of the steady part.
        "worker_cpu_us_per_job": (cpu - first[2]) / (jobs - first[1]) * 1e6
        if jobs > first[1]
        else None,
        "peak_rss_mb": max(rss) if rss else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--extra", default="", help="more jobqueue_worker arguments")
    parser.add_argument("--group", default="", help="the jobs' group")
    parser.add_argument("--uses", default="", help="the jobs' uses, as JSON")
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), *opts.extra.split()]
    uses = json.loads(opts.uses) if opts.uses else None
    for workers in opts.workers:
        harness.report("drain", drain(opts.jobs, workers, args, opts.group, uses))


if __name__ == "__main__":
    main()
