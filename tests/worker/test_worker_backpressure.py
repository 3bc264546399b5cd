"""Back-pressure: a worker whose outcomes cannot be recorded stops claiming.

An application transaction keeps every `running` job row locked, so the worker's completer
cannot record what its handlers finished. The dispatcher must then hold at most
`BACKLOG_FACTOR` times its capacity (threads plus prefetch) claimed and unrecorded, instead of
claiming the whole backlog into memory; once the lock goes, everything is recorded and the rest
drains.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections, transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from django_jobqueue.worker.dispatcher import BACKLOG_FACTOR
from tests.conftest import poll
from tests.support.markers import not_sqlite

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    not_sqlite("needs row locks: on SQLite the application's lock would stop the claim too"),
]

CONCURRENCY = 2
PREFETCH = 8
BOUND = BACKLOG_FACTOR * (CONCURRENCY + PREFETCH)
JOBS = 30 * BOUND
HOLD = 8.0


def lock_running_rows(stop: threading.Event, errors: list[BaseException]) -> None:
    """In one transaction, lock every job row that turns `running`, until `stop`."""
    try:
        with transaction.atomic():
            while not stop.is_set():
                list(Job.objects.select_for_update().filter(state=Job.State.RUNNING).values("pk"))
                time.sleep(0.005)
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)
    finally:
        connections.close_all()


def test_claims_stop_while_outcomes_cannot_be_recorded(start_worker):
    jobqueue.enqueue_many([{"type": "test.noop"}] * JOBS)
    stop, errors = threading.Event(), []
    locker = threading.Thread(target=lock_running_rows, args=(stop, errors))
    locker.start()
    try:
        worker = start_worker("--concurrency", str(CONCURRENCY), "--prefetch", str(PREFETCH))
        worker.wait_registered()
        held = poll(lambda: Job.objects.filter(state=Job.State.RUNNING).count() or None)
        most = held
        deadline = time.monotonic() + HOLD
        while time.monotonic() < deadline:
            most = max(most, Job.objects.filter(state=Job.State.RUNNING).count())
            time.sleep(0.05)
        ready = Job.objects.filter(state=Job.State.READY).count()
    finally:
        stop.set()
        locker.join(60)
    assert not errors, errors
    assert most <= BOUND, f"{most} jobs claimed and unrecorded, bound {BOUND}"
    assert ready > JOBS // 2, f"only {ready} of {JOBS} jobs left ready: the worker kept claiming"
    # Once the lock is gone, the held outcomes are recorded and the rest drains.
    poll(lambda: Job.objects.filter(state=Job.State.DONE).count() == JOBS, timeout=120)
