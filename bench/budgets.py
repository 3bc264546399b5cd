"""What a budget costs a running job: ctx.acquire() plus ctx.settle(), against one claim.

`BENCH_DB=pg python -m bench.budgets [--calls 300] [--rounds 3]`

Issue 48's target: an acquire and its settlement together cost at most one claim. A job is
claimed (its lease held), then its context takes 1 unit of "tokens" (a rate far from full)
and settles 1, `--calls` times, each pair timed (each is two transactions: the grant's, with
its window's row, the lock of the resource and the record; the settlement's, with its row and
record). Claims of 10 plain jobs (each its own transaction, as the dispatcher runs them) are
timed beside them, the two taking turns, so that the machine's drift is the same for both.
`ratio` is the median pair over the median claim (the median of the rounds' ratios).
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
    from django_jobqueue import conf, leases
    from django_jobqueue.context import JobContext
    from django_jobqueue.dialects import get_dialect
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
        pairs, claims = [], []
        for _ in range(calls):
            started = time.perf_counter()
            grant = ctx.acquire("tokens", 1)
            ctx.settle(grant, 1)
            pairs.append(time.perf_counter() - started)
            started = time.perf_counter()
            taken = leases.claim(dialect, owner="bench", queues=["plain"], limit=BATCH,
                                 lease_ttl=30, fair_share=None)  # fmt: skip
            claims.append(time.perf_counter() - started)
            Job.objects.filter(pk__in=[j.pk for j in taken]).update(
                state="done", lease_owner=None, lease_expires=None, finished_at=Now()
            )
        assert conf.get().limits == LIMITS
    return statistics.median(pairs) * 1000, statistics.median(claims) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harness.setup()
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
