"""The claim's cost under JOBQUEUE["LIMITS"] with 10,000 tenants, against no limits.

`BENCH_DB=pg python -m bench.limits_claim [--tenants 10000]`

Two jobs per tenant are ready (20,000 jobs), and 200 claims of 10 are timed, each its own
transaction as the dispatcher runs them (a claim under LIMITS may take fewer while its
candidates adapt: `crowded_jobs_per_claim`). Claimed jobs finish five claims later (outside the
timed part), so about 50 are in flight, as on a busy worker. The same run is made three ways:

- `plain`: no LIMITS, jobs without `uses`: the baseline;
- `tenants`: `"tenant:*": {"concurrency": 1}`, each job using its tenant (`tenant:<n>`), jobs
  in the order tenant 0..N-1, then again: each claim finds ten tenants with room;
- `crowded`: the same limits with each tenant's two jobs next to each other, so half of the
  candidates a claim meets wait for their tenant's other job (the skipped-resource path).

The issue's target: `tenants` costs at most 2x `plain`. The three cases run side by side,
`--rounds` times (3): each figure is the median over the rounds, the ratio the median of the
rounds' own ratios (`ratios` lists them). The machine drifts between the cases of a round,
so `interleaved_ratio` measures the same two claims taking turns, claim by claim, on one
table holding both sets of jobs (queue and group `p` plain, `t` under the limit), `--rounds`
times: its rounds agree within a few percent where the first spread over a factor 1.5.
`grouped_ratio` is the same with a group per tenant (10,000 groups for fair share to split
the slots between), as the limits how-to advises.

Then whether worker processes approach the limits rather than serialize under them (3
workers at `--concurrency 4`): 100 no-op jobs under `{"rate": "10/s"}` (the steady starts a
second, aim >= 8, and the most in any second, <= 10), and 60 jobs of 0.5 s under
`{"concurrency": 8}` (the mean in flight over the steady part, aim >= 7, and the most, <= 8),
both from the jobs' own `started_at` and `finished_at` (database clock).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

from . import harness

CLAIMS = 200
ROUNDS = 3  # plain, tenants and crowded side by side, this many times
BATCH = 10
FINISH_AFTER = 5  # claims a claimed batch stays in flight
LIMITS = {"tenant:*": {"concurrency": 1}}


def enqueue(tenants: int, *, uses: bool, adjacent: bool) -> None:
    from django.db import transaction

    import django_jobqueue as jobqueue

    pairs = [t for t in range(tenants) for _ in range(2)]  # each tenant's jobs side by side
    order = pairs if adjacent else list(range(tenants)) * 2
    specs = [
        {"type": "bench.noop", "args": {"t": t}, **({"uses": {f"tenant:{t}": 1}} if uses else {})}
        for t in order
    ]
    for chunk in range(0, len(specs), 5000):
        with transaction.atomic():
            jobqueue.enqueue_many(specs[chunk : chunk + 5000])
    if uses:  # each resource's lock row, as its first claim made it (see `first_use`)
        make_limit_rows(tenants)
    harness.analyze()


def make_limit_rows(tenants: int) -> None:
    from django_jobqueue.models import Limit

    Limit.objects.bulk_create([Limit(name=f"tenant:{t}") for t in range(tenants)], batch_size=2000)


def timed_claims() -> dict[str, float]:
    from django.db.models.functions import Now

    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare
    from django_jobqueue.models import Job

    dialect = get_dialect("default")
    dialect.bound_waits(5.0, 30.0)
    fair_share = FairShare(conf.get())  # as a worker's dispatcher claims
    times, counts = [], []
    in_flight: deque[list[int]] = deque()
    for _ in range(CLAIMS):
        started = time.perf_counter()
        claimed = leases.claim(
            dialect, owner="bench", queues=[], limit=BATCH, lease_ttl=30, fair_share=fair_share
        )
        times.append(time.perf_counter() - started)
        counts.append(len(claimed))
        in_flight.append([c.pk for c in claimed])
        if len(in_flight) > FINISH_AFTER:
            Job.objects.filter(pk__in=in_flight.popleft()).update(
                state="done", lease_owner=None, lease_expires=None, finished_at=Now()
            )
    # A claim under LIMITS may take fewer than it asks while its candidates adapt to refusals
    # (admission.OVERFETCH): the jobs a claim took on average says how often.
    assert sum(counts) >= 0.9 * CLAIMS * BATCH, counts
    return {
        "median": statistics.median(times) * 1000,
        "mean": statistics.fmean(times) * 1000,
        "jobs_per_claim": statistics.fmean(counts),
    }


def interleaved(tenants: int, *, grouped: bool = False) -> dict[str, float]:
    """The median claim under LIMITS and the median plain claim (ms), the two taking turns
    claim by claim on one table (queue and group "p" without `uses`, "t" with), so that the
    machine's drift between them is nil. `grouped`: each tenant's jobs of "t" have a group of
    their own (`tenant-<n>`, as the limits how-to advises), 10,000 groups for fair share."""
    from django.db import transaction
    from django.db.models.functions import Now
    from django.test import override_settings

    import django_jobqueue as jobqueue
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare
    from django_jobqueue.models import Job

    harness.reset()
    with override_settings(JOBQUEUE={"LIMITS": LIMITS}):
        for queue in ("p", "t"):
            specs = [
                {"type": "bench.noop", "queue": queue, "args": {"t": t},
                 "group": f"tenant-{t}" if grouped and queue == "t" else queue,
                 **({"uses": {f"tenant:{t}": 1}} if queue == "t" else {})}
                for t in list(range(tenants)) * 2
            ]  # fmt: skip
            for chunk in range(0, len(specs), 5000):
                with transaction.atomic():
                    jobqueue.enqueue_many(specs[chunk : chunk + 5000])
        make_limit_rows(tenants)
        harness.analyze()
        limited = FairShare(conf.get())
    with override_settings(JOBQUEUE={}):
        plain = FairShare(conf.get())
    dialect = get_dialect("default")
    dialect.bound_waits(5.0, 30.0)
    times: dict[str, list[float]] = {"p": [], "t": []}
    in_flight: dict[str, deque[list[int]]] = {"p": deque(), "t": deque()}
    with override_settings(JOBQUEUE={"LIMITS": LIMITS}):
        for n in range(CLAIMS):
            for queue in ("p", "t") if n % 2 else ("t", "p"):
                started = time.perf_counter()
                claimed = leases.claim(
                    dialect, owner="bench", queues=[queue], limit=BATCH, lease_ttl=30,
                    fair_share=limited if queue == "t" else plain,
                )  # fmt: skip
                times[queue].append(time.perf_counter() - started)
                in_flight[queue].append([c.pk for c in claimed])
                if len(in_flight[queue]) > FINISH_AFTER:
                    Job.objects.filter(pk__in=in_flight[queue].popleft()).update(
                        state="done", lease_owner=None, lease_expires=None, finished_at=Now()
                    )
    return {q: statistics.median(times[q]) * 1000 for q in times}


def run(tenants: int, *, limits: bool, adjacent: bool = False) -> dict[str, float]:
    from django.test import override_settings

    harness.reset()
    with override_settings(JOBQUEUE={"LIMITS": LIMITS} if limits else {}):
        enqueue(tenants, uses=limits, adjacent=adjacent)
        return timed_claims()


def approach(name: str, spec: dict, jobs: list[tuple[str, dict]]) -> list[tuple]:
    """Drain `jobs` (each using `name`) with 3 workers under LIMITS {name: spec}; return the
    jobs' (started_at, finished_at)."""
    import json
    import os

    from django.test import override_settings

    import django_jobqueue as jobqueue
    from django_jobqueue.models import Job

    harness.reset()
    limits = {name: spec}
    os.environ["BENCH_LIMITS"] = json.dumps(limits)
    with override_settings(JOBQUEUE={"LIMITS": limits}):
        jobqueue.enqueue_many([{"type": t, "args": a, "uses": {name: 1}} for t, a in jobs])
    workers = harness.start_workers(3, ["--concurrency", "4"])
    try:
        harness.wait_until(lambda: harness.done_count() == len(jobs), timeout=300)
    finally:
        harness.stop_workers(workers)
        del os.environ["BENCH_LIMITS"]
    return list(Job.objects.order_by("started_at").values_list("started_at", "finished_at"))


def rate_figures() -> dict[str, float]:
    rows = approach("rate10", {"rate": "10/s"}, [("bench.noop", {})] * 100)
    starts = [s.timestamp() for s, _ in rows]
    steady = starts[10:-10]
    per_s = (len(steady) - 1) / (steady[-1] - steady[0])
    most = max(sum(1 for t in starts if s <= t < s + 1) for s in starts)
    return {"rate_10_per_s_starts": per_s, "rate_10_per_s_most_in_1s": most}


def concurrency_figures() -> dict[str, float]:
    rows = approach("cap8", {"concurrency": 8}, [("bench.sleep", {"seconds": 0.5})] * 60)
    events = sorted([(s.timestamp(), 1) for s, _ in rows] + [(f.timestamp(), -1) for _, f in rows])
    begin, end = events[0][0] + 1.0, events[-1][0] - 1.0  # the steady part
    level, most, area, previous = 0, 0, 0.0, events[0][0]
    for at, step in events:  # the time-weighted number in flight between begin and end
        area += level * max(0.0, min(at, end) - max(previous, begin))
        previous = at
        level += step
        most = max(most, level)
    return {"cap_8_mean_in_flight": area / (end - begin), "cap_8_most_in_flight": most}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    opts = parser.parse_args()
    harness.setup()
    # The three cases side by side, in rounds: the machine drifts between the first case of
    # a run and the last more than the cases differ. Each figure is its median over the rounds.
    cases: dict[str, list[dict[str, float]]] = {"plain": [], "tenants": [], "crowded": []}
    for _ in range(opts.rounds):
        cases["plain"].append(run(opts.tenants, limits=False))
        cases["tenants"].append(run(opts.tenants, limits=True))
        cases["crowded"].append(run(opts.tenants, limits=True, adjacent=True))
    turns = [interleaved(opts.tenants) for _ in range(opts.rounds)]
    grouped = [interleaved(opts.tenants, grouped=True) for _ in range(opts.rounds)]
    plain = [p["median"] for p in cases["plain"]]
    ratios = [t["median"] / p for p, t in zip(plain, cases["tenants"], strict=True)]
    crowded = [c["median"] / p for p, c in zip(plain, cases["crowded"], strict=True)]

    def median(case: str, key: str = "median") -> float:
        return statistics.median(r[key] for r in cases[case])

    harness.report(
        "limits_claim",
        {
            "tenants": opts.tenants,
            "rounds": opts.rounds,
            "plain_ms": median("plain"),
            "tenants_ms": median("tenants"),
            "crowded_ms": median("crowded"),
            "ratio": statistics.median(ratios),
            "ratios": [round(r, 2) for r in ratios],
            "crowded_ratio": statistics.median(crowded),
            "crowded_jobs_per_claim": median("crowded", "jobs_per_claim"),
            "interleaved_plain_ms": statistics.median(r["p"] for r in turns),
            "interleaved_tenants_ms": statistics.median(r["t"] for r in turns),
            "interleaved_ratio": statistics.median(r["t"] / r["p"] for r in turns),
            "interleaved_ratios": [round(r["t"] / r["p"], 2) for r in turns],
            "grouped_plain_ms": statistics.median(r["p"] for r in grouped),
            "grouped_tenants_ms": statistics.median(r["t"] for r in grouped),
            "grouped_ratio": statistics.median(r["t"] / r["p"] for r in grouped),
            "grouped_ratios": [round(r["t"] / r["p"], 2) for r in grouped],
        },
    )
    harness.report("limits_approach", {**rate_figures(), **concurrency_figures()})
    harness.reset()


if __name__ == "__main__":
    main()
