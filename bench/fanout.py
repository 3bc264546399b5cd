"""Fan-out: a map of many no-op children against the same jobs enqueued with enqueue_many.

`BENCH_DB=pg python -m bench.fanout [--jobs 20000] [--workers 2] [--concurrency 8]`

- `fanout_map`: the seconds from the start to all done of one job that maps `bench.noop` over
  `--jobs` items (ctx.map: its children written in bulk, each counting itself down on the
  parent as it finishes, the parent resumed at the end), against `--jobs` `bench.noop` jobs
  enqueued with enqueue_many(); the ratio is the plain time over the map's (target: >= 0.5).
  The workers run before the clock starts, so both times include the writes.
"""

from __future__ import annotations

import argparse
import time

from . import harness


def plain(jobs: int, args: list[str], workers: int) -> float:
    """Seconds from enqueue_many() of `jobs` no-op jobs to all done."""
    import django_jobqueue as jobqueue

    harness.reset()
    running = harness.start_workers(workers, args)
    try:
        time.sleep(3)  # the workers are up and polling
        started = time.perf_counter()
        jobqueue.enqueue_many([("bench.noop", {})] * jobs)
        harness.wait_until(lambda: harness.done_count() >= jobs, 1200)
        return time.perf_counter() - started
    finally:
        harness.stop_workers(running)


def mapped(jobs: int, args: list[str], workers: int) -> float:
    """Seconds from enqueue() of a job that maps a no-op over `jobs` items to its end."""
    import django_jobqueue as jobqueue
    from django_jobqueue.models import Job

    harness.reset()
    running = harness.start_workers(workers, args)
    try:
        time.sleep(3)
        started = time.perf_counter()
        parent = jobqueue.enqueue("bench.map", {"count": jobs})
        done = lambda: Job.objects.filter(pk=parent.pk, state__in=["done", "dead"]).exists()  # noqa: E731
        harness.wait_until(done, 1200)
        elapsed = time.perf_counter() - started
        row = Job.objects.get(pk=parent.pk)
        assert row.state == "done" and row.result == jobs, (row.state, row.last_error)
        return elapsed
    finally:
        harness.stop_workers(running)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), "--poll-interval", "0.05"]
    base = plain(opts.jobs, args, opts.workers)
    fan = mapped(opts.jobs, args, opts.workers)
    harness.report(
        "fanout_map",
        {"jobs": opts.jobs, "worker_processes": opts.workers, "enqueue_many_s": base, "map_s": fan,
         "ratio": base / fan},
    )  # fmt: skip
    harness.reset()


if __name__ == "__main__":
    main()
