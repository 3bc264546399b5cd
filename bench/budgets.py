"""What a budget costs a running job: ctx.acquire() plus ctx.settle(), against one claim.

`BENCH_DB=pg python -m bench.budgets [--calls 300] [--rounds 3]`

Issue 48's target: an acquire and its settlement together cost at most one claim. A job is
claimed (its lease held), then its context takes 1 unit of "tokens" (a rate far from full)
and settles 1, `--calls` times, each pair timed: the grant's transaction (the lock of the
resource, the window's read, its record and row), which also writes the settlement before it
(a settlement at or below its grant waits for the job's next round trip; on PostgreSQL all of
it is one round trip with the COMMIT; on MySQL the settlement commits just before). Claims of
10 plain jobs (each its own transaction, as the dispatcher runs them, with the worker's
`FairShare`, which reads what is paused once a FAIR_SHARE_REFRESH and not at each claim) are
timed beside them, the two taking turns, so that the machine's drift is the same for both.
`ratio` is the median pair over the median claim (the median of the rounds' ratios).

`--approach` measures instead how close worker processes come to a budget's rate: 3 workers
at `--concurrency 8`, 48 async jobs of 10 simulated calls, each taking 100 tokens and settling
1 to 100 of them, under `"tokens": {"rate": "2000/s"}`. `fraction` is the units settled a
second over the steady part of the run (the middle 80% of the grants) over the rate (the
issue's aim: at least 0.8; a window of the period can hold at most the rate, less the units
of the grants not yet settled); `most` the most units of any second's grants.
"""

from __future__ import annotations

import argparse
import statistics
import time

from . import harness

LIMITS = {"tokens": {"rate": "1000000000/s"}}
BATCH = 10


def round_(calls: int) -> tuple[float, float]:
    from django.db import transaction
    from django.db.models.functions import Now
    from django.test import override_settings

    import django_jobqueue as jobqueue
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.context import JobContext
    from django_jobqueue.engine.fair_selection import FairShare
    from django_jobqueue.models import Job

    harness.reset()
    dialect = get_dialect("default")
    with override_settings(JOBQUEUE={"LIMITS": LIMITS}):
        with transaction.atomic():
            jobqueue.enqueue("bench.noop", queue="budget")
            jobqueue.enqueue_many([{"type": "bench.noop", "queue": "plain"}] * (calls * BATCH))
        [claimed] = leases.claim(dialect, owner="bench", queues=["budget"], limit=1,
                                 lease_ttl=600)  # fmt: skip
        ctx = JobContext(claimed, claimed.attempts, "bench", 600, dialect)
        fair_share = FairShare(conf.get())  # the worker's: pauses read once a refresh
        pairs, claims = [], []
        for _ in range(calls):
            started = time.perf_counter()
            grant = ctx.acquire("tokens", 1)
            ctx.settle(grant, 1)
            pairs.append(time.perf_counter() - started)
            started = time.perf_counter()
            taken = leases.claim(dialect, owner="bench", queues=["plain"], limit=BATCH,
                                 lease_ttl=30, fair_share=fair_share)  # fmt: skip
            claims.append(time.perf_counter() - started)
            Job.objects.filter(pk__in=[j.pk for j in taken]).update(
                state="done", lease_owner=None, lease_expires=None, finished_at=Now()
            )
        assert conf.get().limits == LIMITS
    return statistics.median(pairs) * 1000, statistics.median(claims) * 1000


def approach(jobs: int = 48) -> dict[str, float]:
    import datetime as dt
    import json
    import os

    from django.db import transaction
    from django.test import override_settings

    import django_jobqueue as jobqueue
    from django_jobqueue.models import JobStep

    limits = {"tokens": {"rate": "2000/s"}}
    harness.reset()
    os.environ["BENCH_LIMITS"] = json.dumps(limits)
    with override_settings(JOBQUEUE={"LIMITS": limits}), transaction.atomic():
        jobqueue.enqueue_many([("bench.budget_calls", {})] * jobs)
    workers = harness.start_workers(3, ["--concurrency", "8", "--poll-interval", "0.05"])
    try:
        harness.wait_until(lambda: harness.done_count() == jobs, timeout=600)
    finally:
        harness.stop_workers(workers)
        del os.environ["BENCH_LIMITS"]
    grants, used = {}, {}
    for job_id, name, seq, result in JobStep.objects.filter(
        name__in=["@acquire", "@settle"]
    ).values_list("job_id", "name", "seq", "result"):
        if name == "@acquire":
            grants[f"{job_id}:{seq}"] = dt.datetime.fromisoformat(result["granted_at"]).timestamp()
        else:
            used[result["grant"]] = result["used"]
    rows = sorted((at, used[key]) for key, at in grants.items())
    steady = rows[len(rows) // 10 : -len(rows) // 10]
    span = steady[-1][0] - steady[0][0]
    most = max(sum(u for at, u in rows if start <= at < start + 1.0) for start, _ in rows)
    return {"fraction": round(sum(u for _, u in steady) / span / 2000, 3), "most": most}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--approach", action="store_true")
    args = parser.parse_args()
    harness.setup()
    if args.approach:
        harness.report("budgets_approach", approach())
        return
    rounds = [round_(args.calls) for _ in range(args.rounds)]
    harness.report(
        "budgets",
        {
            "acquire_settle_ms": round(statistics.median(p for p, _ in rounds), 3),
            "claim_ms": round(statistics.median(c for _, c in rounds), 3),
            "ratio": round(statistics.median(p / c for p, c in rounds), 3),
        },
    )


if __name__ == "__main__":
    main()
