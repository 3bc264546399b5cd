"""Push wake-up: on PostgreSQL a producer in another process wakes an idle worker at once
(LISTEN/NOTIFY, sent by the enqueuing transaction); elsewhere the worker polls."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, wait_for_job
from tests.support.markers import needs_listen_notify

pytestmark = pytest.mark.django_db(transaction=True)

LONG_POLL = ("--poll-interval", "30")


def listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN django_jobqueue'"
        )
        return bool(cursor.fetchone()[0])


def idle_worker(start_worker):
    worker = start_worker(*LONG_POLL)
    warm = jobqueue.enqueue("test.noop")
    wait_for_job(warm.pk, Job.State.DONE)  # claimed by polling at start-up
    deadline = time.monotonic() + 30
    while not listening():
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.05)
    time.sleep(0.5)  # idle now: its next poll is ~30 s away
    return worker


def time_to_done(make_job) -> float:
    started = time.monotonic()
    job = make_job()
    wait_for_job(job.pk, Job.State.DONE, timeout=20)
    return time.monotonic() - started


@needs_listen_notify("LISTEN/NOTIFY is PostgreSQL's")
def test_enqueue_in_another_process_wakes_an_idle_worker_at_once(start_worker):
    worker = idle_worker(start_worker)
    assert time_to_done(lambda: jobqueue.enqueue("test.noop")) < 5

    def in_a_transaction() -> Job:
        with transaction.atomic():
            job = jobqueue.enqueue("test.noop")
            time.sleep(0.3)  # not before the commit
            assert Job.objects.get(pk=job.pk).state == Job.State.READY
        return job

    assert time_to_done(in_a_transaction) < 5
    assert time_to_done(lambda: jobqueue.enqueue_many([("test.noop", {})])[0]) < 5
    assert worker.stop() == 0
    assert_clean_log(worker.output())


@needs_listen_notify("LISTEN/NOTIFY is PostgreSQL's")
def test_a_job_made_ready_by_an_update_wakes_an_idle_worker(start_worker):
    """retry() makes a job ready by an UPDATE (no INSERT trigger): it notifies as well."""
    dead = jobqueue.enqueue("test.fail_hard")
    worker = idle_worker(start_worker)
    wait_for_job(dead.pk, Job.State.DEAD)
    started = time.monotonic()
    jobqueue.retry(dead)  # it fails again at once: what counts is that it ran at once
    poll_until = time.monotonic() + 20
    while Job.objects.get(pk=dead.pk).attempts < 2:
        assert time.monotonic() < poll_until
        time.sleep(0.01)
    assert time.monotonic() - started < 5
    assert worker.stop() == 0


@needs_listen_notify("LISTEN/NOTIFY is PostgreSQL's")
def test_rolled_back_enqueue_wakes_nobody_and_runs_nothing(start_worker):
    worker = idle_worker(start_worker)
    with pytest.raises(RuntimeError), transaction.atomic():
        jobqueue.enqueue("test.noop")
        raise RuntimeError("rolled back")
    assert Job.objects.filter(state=Job.State.READY).count() == 0
    assert worker.stop() == 0
