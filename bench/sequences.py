"""The claim's cost with 10,000 sequences holding ready jobs, against none.

`BENCH_DB=pg python -m bench.sequences [--sequences 10000]`

20,000 ready jobs of no sequence wait in queue `p`. In the `sequences` case, 10,000 sequences
(queue `s`) hold two jobs each: the head `ready`, the second held `waiting` behind it. 200
claims of 10 of queue `p` are timed, each its own transaction as the dispatcher runs them;
claimed jobs finish five claims later, outside the timed part. The claim never reads a
sequence (a held job is `waiting`, out of the ready index), so the ratio says what 10,000
more ready rows of another queue cost it. `mixed_ms` times claims of every queue in the
`sequences` case (heads claimed too). `enqueue_many_ratio` and `enqueue_ratio` are the cost of
enqueuing into sequences (each job locks its sequence's row) against the same enqueues without
one, through enqueue_many and enqueue (see `enqueue_costs`).

The issue's target: `ratio` <= 2. The cases run side by side, `--rounds` times (3); each figure
is the median over the rounds, the ratio the median of the rounds' own ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

from . import harness

CLAIMS = 200
ROUNDS = 3
BATCH = 10
FINISH_AFTER = 5
OTHERS = 20_000
MANY = 5000
SINGLES = 300


def fill(sequences: int) -> None:
    """Enqueue the other jobs, and two jobs in each of `sequences` sequences."""
    from django.db import transaction

    import django_jobqueue as jobqueue

    plain = [{"type": "bench.noop", "queue": "p", "args": {"i": i}} for i in range(OTHERS)]
    specs = [
        {"type": "bench.noop", "queue": "s", "args": {"s": s}, "sequence": f"account:{s}"}
        for _ in range(2)
        for s in range(sequences)
    ]
    for batch in (plain, specs):
        for chunk in range(0, len(batch), 5000):
            with transaction.atomic():
                jobqueue.enqueue_many(batch[chunk : chunk + 5000])
    harness.analyze()


def enqueue_costs() -> dict[str, float]:
    """The ms per job of enqueues into sequences, against the same enqueues without one.

    `enqueue_many`: MANY jobs in one call, two in each of MANY / 2 new sequences. `enqueue`:
    SINGLES jobs one call (and transaction) each, into SINGLES / 10 sequences. Each pair runs
    side by side on the same table.
    """
    import django_jobqueue as jobqueue

    harness.reset()

    def many(sequenced: bool, base: int) -> None:
        jobqueue.enqueue_many(
            [
                {"type": "bench.noop", "queue": "e", "args": {"i": i}}
                | ({"sequence": f"bulk:{base + i % (MANY // 2)}"} if sequenced else {})
                for i in range(MANY)
            ]
        )

    def singles(sequenced: bool, base: int) -> None:
        for i in range(SINGLES):
            sequence = f"one:{base + i % (SINGLES // 10)}" if sequenced else None
            jobqueue.enqueue("bench.noop", {"i": i}, queue="e", sequence=sequence)

    figures: dict[str, float] = {}
    for name, func, count in (("enqueue_many", many, MANY), ("enqueue", singles, SINGLES)):
        times: dict[bool, list[float]] = {False: [], True: []}
        for turn in range(4):  # plain, sequenced, sequenced, plain: drift cancels out
            for sequenced in (False, True) if turn % 2 == 0 else (True, False):
                started = time.perf_counter()
                func(sequenced, turn * MANY)
                times[sequenced].append((time.perf_counter() - started) * 1000 / count)
        figures[f"{name}_plain_ms_per_job"] = statistics.median(times[False])
        figures[f"{name}_sequenced_ms_per_job"] = statistics.median(times[True])
        figures[f"{name}_ratio"] = statistics.median(times[True]) / statistics.median(times[False])
    return figures


def timed_claims(queues: list[str]) -> float:
    """The median ms of CLAIMS claims of BATCH jobs of `queues`."""
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare

    dialect = get_dialect("default")
    dialect.bound_waits(5.0, 30.0)
    fair_share = FairShare(conf.get())
    times = []
    in_flight: deque[list[tuple[int, int]]] = deque()
    for _ in range(CLAIMS):
        started = time.perf_counter()
        claimed = leases.claim(
            dialect, owner="bench", queues=queues, limit=BATCH, lease_ttl=30, fair_share=fair_share
        )
        times.append(time.perf_counter() - started)
        assert claimed, "nothing to claim"
        in_flight.append([(c.pk, c.attempts) for c in claimed])
        if len(in_flight) > FINISH_AFTER:
            # Finished as a worker finishes them: a head's finish releases its next job.
            items = [(pk, attempt, None) for pk, attempt in in_flight.popleft()]
            leases.finish_many(dialect, "bench", items, in_graph={pk for pk, _, _ in items})
    return statistics.median(times) * 1000


def run(sequences: int) -> dict[str, float]:
    harness.reset()
    fill(sequences)
    figures = {"claim_ms": timed_claims(["p"])}
    if sequences:
        figures["mixed_ms"] = timed_claims([])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    opts = parser.parse_args()
    harness.setup()
    none, some, costs = [], [], []
    for _ in range(opts.rounds):
        none.append(run(0))
        some.append(run(opts.sequences))
        costs.append(enqueue_costs())
    ratios = [s["claim_ms"] / n["claim_ms"] for n, s in zip(none, some, strict=True)]

    def median(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    harness.report(
        "sequences",
        {
            "sequences": opts.sequences,
            "rounds": opts.rounds,
            "none_ms": median(none, "claim_ms"),
            "sequences_ms": median(some, "claim_ms"),
            "ratio": statistics.median(ratios),
            "ratios": [round(r, 2) for r in ratios],
            "mixed_ms": median(some, "mixed_ms"),
            **{key: median(costs, key) for key in costs[0]},
        },
    )
    harness.reset()


if __name__ == "__main__":
    main()
