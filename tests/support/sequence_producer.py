"""Enqueue jobs into one sequence and take a ticket in each transaction (a producer process).

python -m tests.support.sequence_producer KEY MARKER PRODUCER COUNT single|many START_AT

Each transaction enqueues one job (`single`) or five through enqueue_many (`many`) into
sequence KEY, then saves an Order numbered with those jobs' `n`: the sequence's row stays
locked from the enqueue to the commit, so the Orders' ids rise in the order the transactions
committed. Job `n` is PRODUCER * 1000 + its index. It starts at the clock's START_AT, with
the other producers, and prints the errors it met as JSON.
"""

from __future__ import annotations

import json
import random
import sys
import time

import django


def main() -> None:
    django.setup()
    from django.db import transaction

    import django_jobqueue as jobqueue
    from tests.testapp.models import Order

    key, marker, producer, count, mode, start_at = sys.argv[1:7]
    time.sleep(max(0.0, float(start_at) - time.time()))
    each = 1 if mode == "single" else 5
    ns = [int(producer) * 1000 + i for i in range(int(count))]
    failures: list[str] = []
    for first in range(0, len(ns), each):
        batch = ns[first : first + each]
        specs = [
            {"type": "seq.step", "args": {"n": n, "marker": marker}, "sequence": key} for n in batch
        ]
        try:
            with transaction.atomic():
                if mode == "single":
                    jobqueue.enqueue(**specs[0])
                else:
                    jobqueue.enqueue_many(specs)
                time.sleep(random.uniform(0, 0.005))  # the lock held a while, as real work would
                Order.objects.create(number=",".join(map(str, batch)))
        except Exception as exc:  # any error is the test's failure, reported whole
            failures.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps({"failures": failures}))


if __name__ == "__main__":
    main()
