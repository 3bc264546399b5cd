"""A producer process for the chaos suite: enqueues jobs while workers drain the database.

Run as `python -m tests.chaos.producer OUT ROUNDS` with the test settings. Each round writes
in its own transaction, rotating between an `enqueue()` beside a business row, an
`enqueue_many()` of 20 jobs, and a small graph with a container; the ids of each committed
round are appended to OUT. Any exception is printed with its traceback and ends the process
with status 1: nothing is retried here, so a "database is locked" that escapes shows.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

PAUSE = 0.01
SIZES = (1, 20, 7)  # jobs per round of each kind


def expected_jobs(rounds: int) -> int:
    """How many jobs `rounds` rounds produce."""
    return sum(SIZES[number % 3] for number in range(rounds))


def produce_round(number: int) -> list[int]:
    """Write round `number` in one transaction; return the ids of its jobs."""
    from django.db import transaction

    import django_jobqueue as jobqueue
    from tests.testapp.models import Order

    kind = number % 3
    if kind == 0:
        with transaction.atomic():
            Order.objects.create(number=f"chaos-{number}")
            jobs = [jobqueue.enqueue("chaos.step", {"n": number}, max_attempts=5)]
    elif kind == 1:
        jobs = jobqueue.enqueue_many(
            [{"type": "chaos.step", "args": {"n": number * 100 + i}} for i in range(20)]
        )
    else:
        with jobqueue.graph() as g:
            box = g.container(f"chaos-producer-{number}")
            kids = [g.add("chaos.step", {"n": i}, parent=box) for i in range(5)]
            after = g.add("chaos.step", {"n": number}, depends_on=[box])
        jobs = [box, *kids, after]
    return [int(job.pk) for job in jobs]


def main() -> int:
    import django

    django.setup()
    out, rounds = Path(sys.argv[1]), int(sys.argv[2])
    with out.open("a") as ids:
        for number in range(rounds):
            try:
                produced = produce_round(number)
            except Exception:
                traceback.print_exc()
                return 1
            ids.write(" ".join(map(str, produced)) + "\n")
            ids.flush()
            time.sleep(PAUSE)  # spread the writes over the workers' drain
    return 0


if __name__ == "__main__":
    sys.exit(main())
