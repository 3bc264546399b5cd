"""Drain N no-op jobs with W worker processes; report the steady rate and the peak RSS.

`BENCH_DB=pg python -m bench.drain [--jobs 10000] [--workers 2] [--concurrency 8]`

`--group g` puts the jobs in group g and `--uses '{"api": 1}'` gives them `uses`;
`--tenants 10000` spreads them over that many tenants, each job in its tenant's group
(`tenant-<t>`) and using `tenant:<t>` (run it with BENCH_LIMITS='{"tenant:*": {"concurrency":
1}}' for the 10,000-tenant drain of issue 47). With
BENCH_GROUP_LIMITS, BENCH_RATE_LIMITS or BENCH_LIMITS (JSON, see bench/project/settings.py)
the drain runs under those limits (issue 47's before-and-after runs).
"""

from __future__ import annotations

import argparse
import json
import time

from . import harness


def drain(
    jobs: int,
    workers: int,
    args: list[str],
    group: str = "",
    uses: dict | None = None,
    tenants: int = 0,
) -> dict[str, float | None]:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    spec: dict = {"type": "bench.noop", "group": group, **({"uses": uses} if uses else {})}
    if tenants:
        specs = [
            {**spec, "group": f"tenant-{i % tenants}", "uses": {f"tenant:{i % tenants}": 1}}
            for i in range(jobs)
        ]
    else:
        specs = [spec] * jobs
    with transaction.atomic():
        jobqueue.enqueue_many(specs)
    harness.analyze()
    started = time.perf_counter()
    procs = harness.start_workers(workers, args)
    rss: list[float] = []
    first = None
    try:
        while (done := harness.done_count()) < jobs:
            now = time.perf_counter()
            if done and first is None:
                first = (now, done)
                servers = harness.server_pids()
                cpu_first = (
                    harness.cpu_seconds(p.pid for p in procs),
                    harness.cpu_seconds(servers),
                )
            if now - started > 600:
                raise TimeoutError(f"{done}/{jobs} done after 600 s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited early (see .bench-state/workers.log)")
            time.sleep(0.02)
        end = time.perf_counter()
        rss = [r for p in procs if (r := harness.peak_rss_mb(p)) is not None]
        # Over the steady part, as the steady rate (Django's start-up left out).
        worker_cpu = harness.cpu_seconds(p.pid for p in procs) - cpu_first[0]
        server_cpu = harness.cpu_seconds(servers) - cpu_first[1]
    finally:
        harness.stop_workers(procs)
    assert first is not None
    steady = jobs - first[1]
    return {
        "jobs": jobs,
        "workers": workers,
        "args": " ".join(args),
        "tenants": tenants,
        "jobs_per_s": jobs / (end - started),
        "steady_jobs_per_s": steady / (end - first[0]) if end > first[0] else None,
        "startup_s": first[0] - started,
        "peak_rss_mb": max(rss) if rss else None,
        # CPU a job of the workers and of PostgreSQL's backends serving them, from the first
        # job done to the last: steadier than the rate on a busy machine.
        "worker_cpu_us_per_job": worker_cpu * 1e6 / steady if steady else None,
        "server_cpu_us_per_job": server_cpu * 1e6 / steady if steady and servers else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--extra", default="", help="more jobqueue_worker arguments")
    parser.add_argument("--group", default="", help="the jobs' group")
    parser.add_argument("--uses", default="", help="the jobs' uses, as JSON")
    parser.add_argument("--tenants", type=int, default=0, help="spread the jobs over N tenants")
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), *opts.extra.split()]
    uses = json.loads(opts.uses) if opts.uses else None
    for workers in opts.workers:
        harness.report("drain", drain(opts.jobs, workers, args, opts.group, uses, opts.tenants))


if __name__ == "__main__":
    main()
