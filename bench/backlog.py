"""Drain a small and a large backlog side by side in one run: does the rate hold as it grows?

`BENCH_DB=pg python -m bench.backlog [--sizes 20000 300000] [--workers 2] [--concurrency 8]`

For each size: the table is emptied, the jobs are enqueued and the table vacuumed and analyzed
(the state a queue is in after a quiet night), then the workers drain it. Every `--interval`
seconds it records the jobs done in that interval and, on PostgreSQL, the job table's dead
tuples and whether a vacuum ran; at the start, the middle and the end it records the buffers
one claim touches (EXPLAIN (ANALYZE, BUFFERS) of the claim's row choice, rolled back). The
figure that matters is `ratio`: the large backlog's steady drain rate over the small one's.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from . import harness

CHUNK = 10_000  # jobs per enqueue_many() transaction while filling


def fill(jobs: int) -> None:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    for start in range(0, jobs, CHUNK):
        with transaction.atomic():
            jobqueue.enqueue_many([("bench.noop", {})] * min(CHUNK, jobs - start))
    harness.analyze()


def table_stats() -> dict[str, Any]:
    """Dead and live tuples of the job table, and its vacuum count (PostgreSQL only)."""
    from django.db import connection

    from django_jobqueue.models import Job

    if connection.vendor != "postgresql":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup, n_live_tup, vacuum_count + autovacuum_count, "
            "pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = %s",
            [Job._meta.db_table],
        )
        dead, live, vacuums, size = cursor.fetchone()
    return {"dead": dead, "live": live, "vacuums": vacuums, "mib": round(size / 2**20, 1)}


def claim_buffers() -> dict[str, Any]:
    """What one claim's row choice reads now (PostgreSQL: buffers and time; else the plan)."""
    from django.db import connection, transaction

    from django_jobqueue import registry
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.leases import _ready

    dialect = get_dialect("default")
    ready = _ready("default", ("default",), registry.allowlist(), ())
    sql, params = dialect.compile_claim(ready, 8)
    if connection.vendor != "postgresql":
        return {}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0][0]
        transaction.set_rollback(True)
    top = plan["Plan"]
    return {
        "claim_ms": round(plan["Execution Time"], 2),
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
    }


def drain(jobs: int, workers: int, args: list[str], interval: float) -> dict[str, Any]:
    fill(jobs)
    stages = {"start": claim_buffers()}
    started = time.perf_counter()
    procs = harness.start_workers(workers, args)
    counts: list[tuple[float, int]] = []  # (seconds since the start, jobs done)
    samples: list[dict[str, Any]] = []
    done = 0
    try:
        while done < jobs:
            time.sleep(0.25)
            now = time.perf_counter() - started
            if now > 1800:
                raise TimeoutError(f"{done}/{jobs} done after 1800 s")
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited early (see .bench-state/workers.log)")
            done = harness.done_count()
            counts.append((now, done))
            since = next((c for c in reversed(counts) if c[0] <= now - interval), None)
            if since and (not samples or now - samples[-1]["t"] >= interval):
                rate = round((done - since[1]) / (now - since[0]))
                samples.append({"t": round(now, 1), "per_s": rate} | table_stats())
            if "middle" not in stages and done >= jobs // 2:
                stages["middle"] = claim_buffers()
    finally:
        harness.stop_workers(procs)
    stages["end"] = claim_buffers()
    # The steady rate: from 10% to 90% done, leaving out the start-up and the tail.
    t10 = next(t for t, d in counts if d >= jobs * 0.1)
    t90 = next(t for t, d in counts if d >= jobs * 0.9)
    return {
        "jobs": jobs,
        "workers": workers,
        "args": " ".join(args),
        "steady_jobs_per_s": round(jobs * 0.8 / (t90 - t10)) if t90 > t10 else None,
        "samples": samples,
        "claim": stages,
        "after": table_stats(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 300_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--extra", default="", help="more jobqueue_worker arguments")
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), *opts.extra.split()]
    rates = {}
    for size in opts.sizes:
        figures = drain(size, opts.workers, args, opts.interval)
        rates[size] = figures["steady_jobs_per_s"] or 0
        harness.report("backlog", figures)
    small, large = min(rates), max(rates)
    if small != large and rates[small]:
        harness.report(
            "backlog_ratio",
            {"small": small, "large": large, "ratio": round(rates[large] / rates[small], 2)},
        )


if __name__ == "__main__":
    main()
