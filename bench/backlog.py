"""Drain a small and a large backlog side by side in one run: does the rate hold as it grows?

`BENCH_DB=pg python -m bench.backlog [--sizes 20000 300000] [--workers 2] [--concurrency 8]
[--stats fresh stale]`

For each size: the table is emptied, the jobs are enqueued and the table vacuumed and analyzed
(the state a queue is in after a quiet night), then the workers drain it. Every `--interval`
seconds it records the jobs done in that interval and, on PostgreSQL, the job table's dead
tuples and whether a vacuum ran; at the start, the middle and the end it records the buffers
one claim touches (EXPLAIN (ANALYZE, BUFFERS) of the claim's row choice, rolled back). The
figure that matters is `ratio`: the large backlog's steady drain rate over the small one's.

`--stats stale` drains each size a second time with the statistics a fresh deployment has:
the table is analyzed while empty and then filled without a new ANALYZE (the workers'
maintainer may analyze it as it runs; `--extra` passes more worker arguments, and
BENCH_MAINTENANCE=0 turns the maintainer off). `stats_ratio` is the stale drain's steady rate
over the fresh one's, size by size.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from . import harness

CHUNK = 10_000  # jobs per enqueue_many() transaction while filling


def fill(jobs: int, *, stale: bool = False) -> None:
    """Empty the table, then enqueue `jobs` no-op jobs; analyze it full, or (`stale`) only
    while it was empty."""
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()  # vacuums and analyzes the empty table
    for start in range(0, jobs, CHUNK):
        with transaction.atomic():
            jobqueue.enqueue_many([("bench.noop", {})] * min(CHUNK, jobs - start))
    if not stale:
        harness.analyze()


def table_stats() -> dict[str, Any]:
    """What grows with the churn, per database: on PostgreSQL the job table's dead and live
    tuples, its vacuum count and its size (with indexes); on MariaDB InnoDB's purge lag
    (the history list length: undo records not purged yet) and the job table's size as the
    server estimates it; on SQLite the database file, its WAL and the free pages."""
    from django.db import connection

    from django_jobqueue.models import Job

    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT n_dead_tup, n_live_tup, vacuum_count + autovacuum_count, "
                "pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = %s",
                [table],
            )
            dead, live, vacuums, size = cursor.fetchone()
            return {"dead": dead, "live": live, "vacuums": vacuums, "mib": mib(size)}
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count FROM information_schema.INNODB_METRICS "
                "WHERE name = 'trx_rseg_history_len'"
            )
            row = cursor.fetchone()
            cursor.execute(
                "SELECT data_length + index_length FROM information_schema.TABLES "
                "WHERE table_schema = DATABASE() AND table_name = %s",
                [table],
            )
            return {"history_len": row[0] if row else None, "mib": mib(cursor.fetchone()[0])}
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        page = cursor.fetchone()[0]
        cursor.execute("PRAGMA freelist_count")
        free = cursor.fetchone()[0]
    wal = Path(str(connection.settings_dict["NAME"]) + "-wal")
    return {
        "mib": mib(pages * page),
        "free_mib": mib(free * page),
        "wal_mib": mib(wal.stat().st_size) if wal.exists() else 0.0,
    }


def mib(size: int | None) -> float | None:
    return None if size is None else round(int(size) / 2**20, 1)


def claim_buffers() -> dict[str, Any]:
    """What one claim's row choice reads now (PostgreSQL: buffers and time; else the plan)."""
    from django.db import connection, transaction

    from django_jobqueue import registry
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine.leases import _ready

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


def drain(
    jobs: int, workers: int, args: list[str], interval: float, *, stale: bool = False
) -> dict[str, Any]:
    fill(jobs, stale=stale)
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
        "stats": "stale" if stale else "fresh",
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
    parser.add_argument("--stats", nargs="+", choices=["fresh", "stale"], default=["fresh"])
    opts = parser.parse_args()
    harness.setup()
    args = ["--concurrency", str(opts.concurrency), *opts.extra.split()]
    rates: dict[str, dict[int, int]] = {}
    for stats in opts.stats:
        for size in opts.sizes:
            figures = drain(size, opts.workers, args, opts.interval, stale=stats == "stale")
            rates.setdefault(stats, {})[size] = figures["steady_jobs_per_s"] or 0
            harness.report("backlog", figures)
    fresh = rates.get("fresh", {})
    if len(fresh) > 1 and fresh[min(fresh)]:
        small, large = min(fresh), max(fresh)
        harness.report(
            "backlog_ratio",
            {"small": small, "large": large, "ratio": round(fresh[large] / fresh[small], 2)},
        )
    for size, rate in rates.get("stale", {}).items():
        if fresh.get(size):
            harness.report(
                "backlog_stats_ratio",
                {
                    "size": size,
                    "stale": rate,
                    "fresh": fresh[size],
                    "ratio": round(rate / fresh[size], 2),
                },
            )


if __name__ == "__main__":
    main()
