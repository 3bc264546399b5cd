"""A SIGTERM that reaches a worker while it starts up is not lost (found by the kill -9 run:
a supervisor stopped a worker it had just restarted, and the worker never stopped)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections, transaction
from django.utils import timezone

from django_jobqueue.models import Worker
from tests.conftest import poll
from tests.support.markers import not_sqlite

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.chaos,
    pytest.mark.slow,
    # The race is the same on every database; only a row lock holds a start-up still long
    # enough to signal it there (SQLite's write lock also fails the system checks before).
    not_sqlite("needs a row lock"),
]

WORKER_ID = "chaos-start-up"


@contextmanager
def registration_blocked() -> Iterator[None]:
    """Hold the row of the worker id, which a starting worker's registration must wait for."""
    now = timezone.now()
    Worker.objects.create(id=WORKER_ID, host="-", pid=0, concurrency=1, started_at=now,
                          heartbeat_at=now, expires_at=now)  # fmt: skip
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Worker.objects.select_for_update().filter(pk=WORKER_ID))
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(30)
    try:
        yield
    finally:
        release.set()
        holder.join(30)


def test_sigterm_while_the_worker_starts_up_stops_it(start_worker):
    with registration_blocked():
        worker = start_worker("--worker-id", WORKER_ID, "--shutdown-timeout", "5")
        # Signal handlers are installed before this line is logged; registration is blocked.
        poll(lambda: "starting" in worker.output(), timeout=60)
        worker.signal(signal.SIGTERM)
        # The handler runs once the blocked call returns (at once on PostgreSQL, whose driver
        # waits in Python; mysqlclient's wait in C holds it until the lock is released).
        time.sleep(1)
    assert worker.wait(30) == 0
    assert "Signal 15" in worker.output()
