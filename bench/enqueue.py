"""Enqueue speed: `enqueue()` one by one against a bare `Model.objects.create()` of the same row,
and `enqueue_many()` in bulk.

`BENCH_DB=pg python -m bench.enqueue [--jobs 5000]`

Each single enqueue is its own transaction (autocommit), as in a web request. The bare
create writes the same table with no validation, no handler look-up and no wake-up: the
floor of what an enqueue can cost through the ORM.
"""

from __future__ import annotations

import argparse
import time

from . import harness


def timed(func: object, jobs: int) -> float:
    harness.reset()
    started = time.perf_counter()
    func()  # type: ignore[operator]
    return jobs / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    opts = parser.parse_args()
    harness.setup()
    from django.db import transaction

    import django_jobqueue as jobqueue
    from django_jobqueue.models import Job

    n = opts.jobs

    def bare() -> None:
        for _ in range(n):
            Job.objects.create(type="bench.noop", args={})

    def single() -> None:
        for _ in range(n):
            jobqueue.enqueue("bench.noop", {})

    def bulk() -> None:
        with transaction.atomic():
            jobqueue.enqueue_many([("bench.noop", {})] * n)

    figures = {}
    for name, func in (("bare_create", bare), ("enqueue", single), ("enqueue_many", bulk)):
        timed(func, min(n, 200))  # warm-up
        figures[f"{name}_per_s"] = timed(func, n)
    figures["enqueue_vs_bare"] = figures["enqueue_per_s"] / figures["bare_create_per_s"]
    harness.report("enqueue", {"jobs": n, **figures})
    harness.reset()


if __name__ == "__main__":
    main()
