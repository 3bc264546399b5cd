"""The claim's cost with 10,000 sequences holding ready jobs, against none.

`BENCH_DB=pg python -m bench.sequences [--sequences 10000]`

20,000 ready jobs of no sequence wait in queue `p`. In the `sequences` case, 10,000 sequences
(queue `s`) hold two jobs each: the head `ready`, the second held `waiting` behind it. 200
claims of 10 of queue `p` are timed, each its own transaction as the dispatcher runs them;
claimed jobs finish five claims later, outside the timed part. The claim never reads a
sequence (a held job is `waiting`, out of the ready index), so the ratio says what 10,000
more ready rows of another queue cost it. `mixed_ms` times claims of every queue in the
`sequences` case (heads claimed too). `enqueue_ms_per_job` is the enqueue of a sequenced job
(each locks its sequence's row) through enqueue_many, against `plain_enqueue_ms_per_job`.

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


def fill(sequences: int) -> dict[str, float]:
    """Enqueue the other jobs, and two jobs in each of `sequences` sequences; return the
    enqueue's ms per job of each kind."""
    from django.db import transaction

    import django_jobqueue as jobqueue

    plain = [{"type": "bench.noop", "queue": "p", "args": {"i": i}} for i in range(OTHERS)]
    started = time.perf_counter()
    for chunk in range(0, len(plain), 5000):
        with transaction.atomic():
            jobqueue.enqueue_many(plain[chunk : chunk + 5000])
    figures = {"plain_enqueue_ms_per_job": (time.perf_counter() - started) * 1000 / OTHERS}
    if sequences:
        specs = [
            {"type": "bench.noop", "queue": "s", "args": {"s": s}, "sequence": f"account:{s}"}
            for _ in range(2)
            for s in range(sequences)
        ]
        started = time.perf_counter()
        for chunk in range(0, len(specs), 5000):
            with transaction.atomic():
                jobqueue.enqueue_many(specs[chunk : chunk + 5000])
        figures["enqueue_ms_per_job"] = (time.perf_counter() - started) * 1000 / len(specs)
    harness.analyze()
    return figures


def timed_claims(queues: list[str]) -> float:
    """The median ms of CLAIMS claims of BATCH jobs of `queues`."""
    from django_jobqueue import conf, leases
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.fairshare import FairShare

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
    figures = fill(sequences)
    figures["claim_ms"] = timed_claims(["p"])
    if sequences:
        figures["mixed_ms"] = timed_claims([])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequences", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    opts = parser.parse_args()
    harness.setup()
    none, some = [], []
    for _ in range(opts.rounds):
        none.append(run(0))
        some.append(run(opts.sequences))
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
            "enqueue_ms_per_job": median(some, "enqueue_ms_per_job"),
            "plain_enqueue_ms_per_job": median(none, "plain_enqueue_ms_per_job"),
        },
    )
    harness.reset()


if __name__ == "__main__":
    main()
