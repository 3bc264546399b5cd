"""Liveness that nothing can starve: a live job keeps its lease while an application holds its
row locked, or while the worker's dispatcher is stuck; it runs exactly once.

Each test runs two worker processes with a 2 s lease: the second one would take the job back
(and run it again) if the first one's liveness failed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection, connections, transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Limit
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.markers import not_sqlite
from tests.support.workflow_support import limits_env
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SQLITE = connection.vendor == "sqlite"
# On SQLite the hold must stay under the handlers' own busy timeout (tests/settings.py):
# a handler that writes while the test holds the database would fail otherwise.
TTL = 1.5 if SQLITE else 2.0
SHORT_LEASE = ("--lease-ttl", str(TTL), "--heartbeat-interval", "0.5")
HOLD = 3 * TTL
# Holding a row on SQLite means holding the database's write lock: every worker's writes,
# heartbeats included, wait for it (and say so); that is what this proves they survive.
SQLITE_WAITS = ("database is locked", "Database error in the worker loop", "Could not record")


@contextmanager
def holding(lock: callable, seconds: float) -> Iterator[None]:  # type: ignore[valid-type]
    """Run `lock()` in a transaction of another thread and keep it open for `seconds`."""
    locked = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with transaction.atomic():
                lock()
                locked.set()
                time.sleep(seconds)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    assert locked.wait(30)
    try:
        yield
    finally:
        thread.join(seconds + 60)
    assert not errors, errors


def lock_job_row(pk: int) -> None:
    if SQLITE:  # the write lock, taken by a write
        Job.objects.filter(pk=pk).update(priority=0)
    else:
        list(Job.objects.select_for_update().filter(pk=pk))


def assert_ran_once(pk: int, *workers) -> None:
    done = wait_for_job(pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert done.attempts == 1, done.errors
    assert RunRecord.objects.filter(job_id=pk).count() == 1
    for worker in workers:
        assert worker.stop() == 0
        text = worker.output()
        assert "Reclaimed" not in text
        assert_clean_log(text, allow=SQLITE_WAITS if SQLITE else ())


def start_pair(start_worker, *owner_args: str, env: dict[str, str] | None = None) -> tuple:
    """Start the rescuer (claiming only from a queue of its own: its reclaimer still looks at
    every lease) and the owner, and wait until both are up, before the test enqueues: on a
    loaded machine a start takes seconds, which would eat into the job's run."""
    rescuer = start_worker(*SHORT_LEASE, "--queue", "rescuer-only", env=env)
    owner = start_worker(*SHORT_LEASE, *owner_args, env=env)
    rescuer.wait_registered()
    owner.wait_registered()
    return rescuer, owner


def test_job_whose_row_an_application_holds_locked_for_three_ttls_runs_once(start_worker):
    """The lease row cannot be renewed for 3 TTLs; the worker's own row still says it holds
    the job, so nobody takes it back when the lock goes."""
    rescuer, owner = start_pair(start_worker)
    job = jobqueue.enqueue("test.record", {"sleep": HOLD + 3, "value": "once"}, max_attempts=3)
    wait_for_job(job.pk, Job.State.RUNNING)
    with holding(lambda: lock_job_row(job.pk), HOLD):
        pass
    assert_ran_once(job.pk, owner, rescuer)


def test_job_that_finishes_while_its_row_is_held_is_recorded_after(start_worker):
    """The handler returns while the row is locked: the outcome waits (no handler rerun)."""
    # The handler must still run when the lock is taken and return while it is held: both
    # workers are up before the job is enqueued (a start takes seconds on a loaded machine).
    rescuer, owner = start_pair(start_worker)
    job = jobqueue.enqueue("test.record", {"sleep": HOLD - 1, "value": "once"}, max_attempts=3)
    wait_for_job(job.pk, Job.State.RUNNING)
    with holding(lambda: lock_job_row(job.pk), HOLD):
        if not SQLITE:  # on SQLite the handler's own write waits for the lock too
            assert not RunRecord.objects.filter(job_id=job.pk).exists(), "returned too early"
            poll(lambda: RunRecord.objects.filter(job_id=job.pk).exists(), timeout=30)
            assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    assert_ran_once(job.pk, owner, rescuer)
    assert Job.objects.get(pk=job.pk).result == "once"


def test_worker_whose_dispatcher_is_stuck_keeps_its_leases(start_worker, tmp_path: Path):
    """A DYNAMIC_LIMIT hook that blocks the claim for 3 TTLs: the dispatcher is stuck, the
    heartbeat (its own thread and connection) goes on, the running job is not taken back."""
    marker = tmp_path / "stuck"
    env = {
        "JOBQUEUE_TEST_DYNAMIC_LIMIT": "tests.testapp.workflow_jobs.stuck_limit",
        "JOBQUEUE_TEST_STUCK_FILE": str(marker),
    }
    rescuer, owner = start_pair(start_worker, "--concurrency", "2", env=env)
    job = jobqueue.enqueue("test.record", {"sleep": HOLD + 3, "value": "once"}, max_attempts=3)
    wait_for_job(job.pk, Job.State.RUNNING)
    marker.touch()
    later = jobqueue.enqueue("test.noop")  # every claim now asks the hook, and waits
    time.sleep(HOLD)
    marker.unlink()
    assert_ran_once(job.pk, owner, rescuer)
    assert wait_for_job(later.pk, Job.State.DONE).state == Job.State.DONE


@not_sqlite("a row lock; on SQLite it is the database lock (tests above)")
def test_worker_whose_claim_waits_on_a_locked_limit_row_keeps_its_leases(start_worker):
    """The claim blocks on a limit's lock row an application holds (until the worker's lock
    timeout, then again): the running job keeps its lease all along."""
    env = limits_env(group_limits={"g": 5})
    job = jobqueue.enqueue("test.record", {"sleep": HOLD + 3, "value": "once"}, max_attempts=3)
    owner = start_worker(*SHORT_LEASE, "--concurrency", "2", env=env)
    wait_for_job(job.pk, Job.State.RUNNING)
    rescuer = start_worker(*SHORT_LEASE, env=env)
    rescuer.wait_registered()
    poll(lambda: Limit.objects.filter(name="group:g").exists())
    later = jobqueue.enqueue("test.noop", group="g")
    with holding(lambda: list(Limit.objects.select_for_update().filter(name="group:g")), HOLD):
        pass
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts) == (Job.State.DONE, 1)
    assert RunRecord.objects.filter(job_id=job.pk).count() == 1
    assert wait_for_job(later.pk, Job.State.DONE).state == Job.State.DONE
    for worker in (owner, rescuer):
        assert worker.stop() == 0
        assert "Reclaimed" not in worker.output()
