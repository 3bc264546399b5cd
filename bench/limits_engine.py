"""The claim under each kind of limit, against a claim without limits, taking turns.

`BENCH_DB=pg python -m bench.limits_engine [--rounds 3]`

Issue 47 asked that one limits engine make no claim slower: with no limits, with
GROUP_LIMITS, with RATE_LIMITS, and with LIMITS over 10,000 tenants. Each case has its own
queue of jobs on one table, and the cases' claims take turns, claim by claim (200 claims of 10
each, each its own transaction as the dispatcher runs them; a claimed batch finishes five
claims later, so about 50 jobs are in flight), so that the machine's drift is the same for
all. Each figure is the median claim (ms); run it from two checkouts (before and after a
change) one after the other to compare them, and read each case against `plain` of its own
run.

- `plain`: no limit, one group;
- `group`: GROUP_LIMITS {"g": 1000}: one capped group, never full;
- `rate`: RATE_LIMITS {"r": "1000000/s"}: one rated group, never full;
- `tenants`: LIMITS {"tenant:*": {"concurrency": 1}} with a group per tenant, 10,000 tenants
  of two jobs each (the limits how-to's advice; `bench.limits_claim`'s `grouped_ratio`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

from . import harness

CLAIMS = 200
BATCH = 10
FINISH_AFTER = 5
TENANTS = 10_000
CASES = {
    "plain": {},
    "group": {"GROUP_LIMITS": {"g": 1000}},
    "rate": {"RATE_LIMITS": {"r": "1000000/s"}},
    "tenants": {"LIMITS": {"tenant:*": {"concurrency": 1}}},
}


def setting() -> dict:
    """One JOBQUEUE holding every case's limits (each case's jobs meet only their own)."""
    merged: dict = {}
    for value in CASES.values():
        merged.update(value)
    return merged


def fill(tenants: int) -> None:
    from django.db import transaction

    import django_jobqueue as jobqueue
    from django_jobqueue.models import Limit

    specs = []
    for name in ("plain", "group", "rate"):
        group = {"plain": "p", "group": "g", "rate": "r"}[name]
        specs += [{"type": "bench.noop", "queue": name, "group": group}] * (CLAIMS * BATCH + 500)
    specs += [
        {"type": "bench.noop", "queue": "tenants", "group": f"tenant-{t}", "args": {"t": t},
         "uses": {f"tenant:{t}": 1}}
        for t in list(range(tenants)) * 2
    ]  # fmt: skip
    for chunk in range(0, len(specs), 5000):
        with transaction.atomic():
            jobqueue.enqueue_many(specs[chunk : chunk + 5000])
    # Each resource's lock row, as its first claim made it.
    Limit.objects.bulk_create(
        [Limit(name=f"tenant:{t}") for t in range(tenants)], batch_size=2000, ignore_conflicts=True
    )
    harness.analyze()


def round_(tenants: int) -> dict[str, float]:
    from django.db.models.functions import Now
    from django.test import override_settings

    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare
    from django_jobqueue.models import Job

    harness.reset()
    with override_settings(JOBQUEUE=setting()):
        fill(tenants)
    shares = {}
    for name, value in CASES.items():
        with override_settings(JOBQUEUE=value):
            shares[name] = FairShare(conf.get())
            shares[name].ensure_limit_rows("default")
    dialect = get_dialect("default")
    dialect.bound_waits(5.0, 30.0)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    in_flight: dict[str, deque[list[int]]] = {name: deque() for name in CASES}
    names = list(CASES)
    with override_settings(JOBQUEUE=setting()):
        for n in range(CLAIMS):
            for name in names[n % len(names) :] + names[: n % len(names)]:
                started = time.perf_counter()
                claimed = leases.claim(
                    dialect, owner="bench", queues=[name], limit=BATCH, lease_ttl=30,
                    fair_share=shares[name],
                )  # fmt: skip
                times[name].append(time.perf_counter() - started)
                in_flight[name].append([c.pk for c in claimed])
                if len(in_flight[name]) > FINISH_AFTER:
                    Job.objects.filter(pk__in=in_flight[name].popleft()).update(
                        state="done", lease_owner=None, lease_expires=None, finished_at=Now()
                    )
    return {name: statistics.median(times[name]) * 1000 for name in times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tenants", type=int, default=TENANTS)
    args = parser.parse_args()
    harness.setup()
    rounds = [round_(args.tenants) for _ in range(args.rounds)]
    figures: dict[str, float] = {}
    for name in CASES:
        figures[f"{name}_ms"] = round(statistics.median(r[name] for r in rounds), 3)
        if name != "plain":
            ratio = statistics.median(r[name] / r["plain"] for r in rounds)
            figures[f"{name}_ratio"] = round(ratio, 3)
    harness.report("limits_engine", figures)


if __name__ == "__main__":
    main()
