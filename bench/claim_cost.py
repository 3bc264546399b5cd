"""The claim's cost in a table full of history against an empty one.

`BENCH_DB=pg python -m bench.claim_cost [--finished 1000000] [--scheduled 100000]`

The same 2,000 ready jobs are claimed 10 at a time (200 claims, each its own transaction, as
the dispatcher runs them) in an otherwise empty table, then in one that also holds `finished`
done jobs and `scheduled` jobs due in the future. The claim reads only the ready index, so
the two should cost the same.
"""

from __future__ import annotations

import argparse
import statistics
import time

from . import harness

CLAIMS = 200
BATCH = 10


def fill(finished: int, scheduled: int) -> None:
    """Insert history rows in bulk, server-side (a cross join of a 1,000-row sequence)."""
    from django.db import connection

    from django_jobqueue.models import Job

    vendor = connection.vendor
    now = {
        "postgresql": "now()",
        "mysql": "UTC_TIMESTAMP(6)",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }[vendor]
    later = {
        "postgresql": "now() + interval '1 day'",
        "mysql": "UTC_TIMESTAMP(6) + INTERVAL 1 DAY",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 day')",
    }[vendor]
    false = "FALSE" if vendor != "sqlite" else "0"
    columns = (
        "type, args, state, attempts, max_attempts, queue, priority, group_key, weight, errors, "
        "worker_ids, is_container, sealed, cancel_requested, has_dependents, open_children, "
        "unique_slot, created_at, updated_at, finished_at, run_after, result"
    )
    seq = (
        "WITH RECURSIVE d(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 999) "
        "SELECT {values} FROM d AS a, d AS b {limit}"
    )
    flags = ", ".join([false] * 4)  # is_container, sealed, cancel_requested, has_dependents
    common = f"'bench.noop', '{{}}', %s, %s, 3, 'default', 0, '', 1, '[]', '[]', {flags}, 0"
    done = f"{common}, NULL, {now}, {now}, {now}, NULL, 'null'"
    future = f"{common}, 1, {now}, {now}, NULL, {later}, NULL"
    with connection.cursor() as cursor:
        for count, state, attempts, values in (
            (finished, "done", 1, done),
            (scheduled, "scheduled", 0, future),
        ):
            left = count
            while left > 0:  # at most 1,000,000 rows a statement (the cross join's size)
                n = min(left, 1_000_000)
                select = seq.format(values=values, limit=f"LIMIT {n}")
                cursor.execute(
                    f"INSERT INTO {Job._meta.db_table} ({columns}) {select}", [state, attempts]
                )
                left -= n
    harness.analyze()


def claim_cost(ready: int = CLAIMS * BATCH) -> dict[str, float]:
    """Enqueue `ready` jobs, then time the claims that take them all, BATCH at a time."""
    from django.db import transaction

    import django_jobqueue as jobqueue
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare

    with transaction.atomic():
        jobqueue.enqueue_many([("bench.noop", {})] * ready)
    harness.analyze()
    dialect = get_dialect("default")
    dialect.bound_waits(5.0, 30.0)
    fair_share = FairShare(conf.get())  # as a worker's dispatcher claims
    times = []
    for _ in range(CLAIMS):
        started = time.perf_counter()
        claimed = leases.claim(
            dialect, owner="bench", queues=[], limit=BATCH, lease_ttl=30, fair_share=fair_share
        )
        times.append(time.perf_counter() - started)
        assert len(claimed) == BATCH
    return {
        "claim_ms_median": statistics.median(times) * 1000,
        "claim_ms_mean": statistics.fmean(times) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--scheduled", type=int, default=100_000)
    opts = parser.parse_args()
    harness.setup()
    harness.reset()
    empty = claim_cost()
    harness.reset()
    started = time.perf_counter()
    fill(opts.finished, opts.scheduled)
    filled_in = time.perf_counter() - started
    full = claim_cost()
    harness.report(
        "claim_cost",
        {
            "finished_rows": opts.finished,
            "scheduled_rows": opts.scheduled,
            "fill_s": filled_in,
            "empty_ms": empty["claim_ms_median"],
            "full_ms": full["claim_ms_median"],
            "ratio": full["claim_ms_median"] / empty["claim_ms_median"],
        },
    )
    harness.reset()


if __name__ == "__main__":
    main()
