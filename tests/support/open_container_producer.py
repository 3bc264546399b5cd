"""Open a container outside a transaction, add one child, print its id, then hang in the block.

python -m tests.support.open_container_producer: the test kills this process inside the block, as a
deploy or an OOM kill would kill a producer, so the container is never sealed.
"""

from __future__ import annotations

import time

import django


def main() -> None:
    django.setup()
    import django_jobqueue as jobqueue

    with jobqueue.container("batch") as box:
        jobqueue.enqueue("test.add", {"a": 1, "b": 2}, parent=box)
        print(box.pk, flush=True)
        time.sleep(600)


if __name__ == "__main__":
    main()
