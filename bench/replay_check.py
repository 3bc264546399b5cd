"""The replay's position check: the drain of durable jobs of 20 steps, with it and without it,
in one run.

`BENCH_DB=pg python -m bench.replay_check [--jobs 1000] [--rounds 2]`

Each job takes 20 no-op steps, sleeps 10 ms (a durable sleep: it suspends) and, resumed,
replays its 20 records before it ends: so the check is paid where it costs most, at each
recorded call (20 place lookups and comparisons a replay), and each record carries its place.
2 workers at `--concurrency 8` drain `--jobs` such jobs; the steady rate is measured from the
first job done to the last (`durable.drain`).

"Before" is the same drain with the check switched off in the workers
(`django_jobqueue.replay._CHECK_PLACES = False`, a private switch that the bench app sets
from `BENCH_REPLAY_CHECK=0`): calls take no place, their records have none, and a replay
matches them by name and call number only, as records written before places were. The two
drains alternate, `--rounds` times each (off first), and the best rate of each is compared,
since a loaded machine only ever slows a drain down.
`ratio` = checked / unchecked jobs/s (target: about 1, at least 0.95).
"""

from __future__ import annotations

import argparse
import os

from . import durable, harness


def drain(jobs: int, checked: bool) -> float:
    """Steady jobs/s of `jobs` jobs of bench.replayed_steps, the check on or off."""
    from django_jobqueue.models import JobStep

    os.environ["BENCH_REPLAY_CHECK"] = "1" if checked else "0"  # read by the workers
    try:
        rate = durable.drain("bench.replayed_steps", jobs)
    finally:
        os.environ.pop("BENCH_REPLAY_CHECK", None)
    # The workers did as asked: records with places only when checked.
    placed = JobStep.objects.filter(place__isnull=False).exists()
    assert placed == checked, f"checked={checked} but records with places: {placed}"
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    harness.setup()
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(opts.rounds):
        for checked in (False, True):
            rates[checked].append(drain(opts.jobs, checked))
    unchecked, checked = max(rates[False]), max(rates[True])
    harness.report(
        "replay_check_drain",
        {"jobs": opts.jobs, "steps": 20, "unchecked_per_s": unchecked, "checked_per_s": checked,
         "unchecked_runs": rates[False], "checked_runs": rates[True],
         "ratio": checked / unchecked},
    )  # fmt: skip
    harness.reset()


if __name__ == "__main__":
    main()
