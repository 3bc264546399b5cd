"""Sustained load: a producer enqueues at a steady rate for minutes while workers drain and
RETENTION prunes. Does the drain keep up, and does the table stay bounded?

`BENCH_DB=pg python -m bench.sustained [--rate 3000] [--minutes 10] [--workers 2]`

The producer (this process) enqueues `--rate / 10` no-op jobs every 0.1 s with
enqueue_many(); the workers run with `RETENTION = {"done": "1m"}` (BENCH_RETENTION). Every
`--interval` seconds it records the jobs drained in that interval (enqueued minus those still
ready or running), the ready backlog, and on PostgreSQL the job table's size and dead tuples.
The figures that matter: `last_over_first` (the drain rate of the last minute over the
first's), the largest backlog in seconds of work, and the table's size over time.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from . import harness
from .backlog import table_stats

CHUNKS_PER_S = 10


def counts() -> tuple[int, int]:
    """(ready, running or leased) jobs."""
    from django_jobqueue.models import Job

    ready = Job.objects.filter(state=Job.State.READY).count()
    busy = Job.objects.filter(state__in=Job.LEASED_STATES).count()
    return ready, busy


def oldest_done_s() -> float | None:
    from django.db.models import Min
    from django.utils import timezone

    from django_jobqueue.models import Job

    oldest = Job.objects.filter(state=Job.State.DONE).aggregate(m=Min("finished_at"))["m"]
    return round((timezone.now() - oldest).total_seconds()) if oldest else None


def run(
    rate: int, minutes: float, workers: int, args: list[str], interval: float
) -> dict[str, Any]:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    chunk = max(1, rate // CHUNKS_PER_S)
    procs = harness.start_workers(workers, args)
    started = time.perf_counter()
    enqueued = 0
    samples: list[dict[str, Any]] = []
    last_t, last_drained = 0.0, 0
    next_chunk = started
    next_sample = started + interval
    try:
        while (now := time.perf_counter()) - started < minutes * 60:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited early (see .bench-state/workers.log)")
            if now >= next_chunk:
                with transaction.atomic():
                    jobqueue.enqueue_many([("bench.noop", {})] * chunk)
                enqueued += chunk
                next_chunk += 1 / CHUNKS_PER_S
            if now >= next_sample:
                ready, busy = counts()
                drained = enqueued - ready - busy
                t = now - started
                per_s = (drained - last_drained) / (t - last_t)
                samples.append(
                    {
                        "t": round(t),
                        "drained_per_s": round(per_s),
                        "ready": ready,
                        "backlog_s": round(ready / per_s, 1) if per_s > 0 else None,
                        "oldest_done_s": oldest_done_s(),
                    }
                    | table_stats()
                )
                print(samples[-1], flush=True)
                last_t, last_drained = t, drained
                next_sample += interval
            time.sleep(max(0.0, min(next_chunk, next_sample) - time.perf_counter()))
    finally:
        harness.stop_workers(procs)

    def minute_rate(first: bool) -> float:
        window = [s for s in samples if (s["t"] <= 60 if first else s["t"] > samples[-1]["t"] - 60)]
        return sum(s["drained_per_s"] for s in window) / max(1, len(window))

    first, last = minute_rate(True), minute_rate(False)
    return {
        "rate": rate,
        "minutes": minutes,
        "workers": workers,
        "args": " ".join(args),
        "first_minute_per_s": round(first),
        "last_minute_per_s": round(last),
        "last_over_first": round(last / first, 2) if first else None,
        "max_backlog_s": max((s["backlog_s"] or 0) for s in samples) if samples else None,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--extra", default="", help="more jobqueue_worker arguments")
    opts = parser.parse_args()
    os.environ.setdefault("BENCH_RETENTION", '{"done": "1m"}')
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), *opts.extra.split()]
    harness.report("sustained", run(opts.rate, opts.minutes, opts.workers, args, opts.interval))


if __name__ == "__main__":
    main()
