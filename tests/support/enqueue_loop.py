"""Enqueue jobs one by one and report failures and latencies as JSON (a producer process).

python -m tests.support.enqueue_loop COUNT [plain|atomic]: `atomic` saves a business row and the job
in one transaction, as a web request would.
"""

from __future__ import annotations

import json
import sys
import time

import django


def main() -> None:
    django.setup()
    from django.db import DatabaseError, transaction

    import django_jobqueue as jobqueue
    from tests.testapp.models import Order

    count, mode = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "plain"
    failures: list[str] = []
    latencies: list[float] = []
    for n in range(count):
        start = time.perf_counter()
        try:
            if mode == "atomic":
                with transaction.atomic():
                    Order.objects.create(number=str(n))
                    jobqueue.enqueue("test.noop")
            else:
                jobqueue.enqueue("test.noop")
        except DatabaseError as exc:
            failures.append(str(exc))
        latencies.append(time.perf_counter() - start)
    print(json.dumps({"failures": failures, "latencies": latencies}))


if __name__ == "__main__":
    main()
