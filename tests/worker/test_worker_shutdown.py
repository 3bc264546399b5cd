"""Stopping a worker process: SIGTERM drains or releases, a second signal leaves at once."""

from __future__ import annotations

import signal
import socket
import time

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = pytest.mark.django_db(transaction=True)

SIGNAL_SEEN = "finishing in-flight jobs, then stopping"


def running_job(worker, *args, **kwargs) -> Job:
    """Enqueue a job and return it once `worker` is running it."""
    job = jobqueue.enqueue(*args, **kwargs)
    running = wait_for_job(job.pk, Job.State.RUNNING)
    assert running.lease_owner == worker.row().id
    return running


def test_sigterm_releases_an_unfinished_job_without_charging_the_attempt(start_worker):
    worker = start_worker("--shutdown-timeout", "1")
    worker.wait_registered()
    job = running_job(worker, "test.sleep", {"seconds": 600})
    assert job.attempts == 1
    signalled = time.monotonic()
    assert worker.stop(timeout=300) == 0
    # ~1 s of grace, not the job's 600 s (the bound leaves room for a loaded machine).
    assert time.monotonic() - signalled < 300
    released = Job.objects.get(pk=job.pk)
    assert released.state == Job.State.READY
    assert released.attempts == 0  # not charged: the next claim is attempt 1 again
    assert released.lease_owner is None
    assert released.lease_expires is None
    assert released.run_after is None  # runnable again at once
    assert released.last_error is None
    assert "released 1 unfinished job(s) back to ready" in worker.output()
    assert not Worker.objects.live().exists()


def test_released_job_runs_on_the_next_worker_as_attempt_one(start_worker):
    first = start_worker("--shutdown-timeout", "0")
    first.wait_registered()
    # 4 s: the stop must come before the handler returns, on a loaded machine too.
    job = running_job(first, "test.record", {"sleep": 4, "value": "second"})
    assert first.stop() == 0  # released at once, before its handler could record a run
    assert Job.objects.get(pk=job.pk).state == Job.State.READY
    second = start_worker()
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD)
    assert done.state == Job.State.DONE
    assert done.result == "second"
    assert done.attempts == 1
    assert list(RunRecord.objects.values_list("attempt", "worker_pid")) == [(1, second.pid)]
    assert second.stop() == 0


def test_sigterm_lets_the_in_flight_job_finish_and_claims_nothing_new(start_worker):
    worker = start_worker("--concurrency", "2", "--shutdown-timeout", "60")
    worker.wait_registered()
    job = running_job(worker, "test.record", {"sleep": 2, "value": "finished"})
    worker.signal(signal.SIGTERM)
    poll(lambda: SIGNAL_SEEN in worker.output(), timeout=30)
    later = jobqueue.enqueue("test.add", {"a": 1, "b": 2})  # a free slot, but stopping
    assert worker.wait(60) == 0
    done = Job.objects.get(pk=job.pk)
    assert done.state == Job.State.DONE
    assert done.result == "finished"
    assert done.attempts == 1
    assert RunRecord.objects.filter(job_id=job.pk).count() == 1
    untouched = Job.objects.get(pk=later.pk)
    assert untouched.state == Job.State.READY
    assert untouched.attempts == 0
    assert not Worker.objects.live().exists()
    assert_clean_log(worker.output())


def test_second_sigterm_exits_at_once_leaving_the_lease_to_expire(start_worker):
    worker = start_worker("--shutdown-timeout", "900")
    worker.wait_registered()
    job = running_job(worker, "test.sleep", {"seconds": 900})
    worker.signal(signal.SIGTERM)
    poll(lambda: SIGNAL_SEEN in worker.output(), timeout=60)
    assert worker.running()  # draining: waiting for the job
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(300) == 128 + signal.SIGTERM
    # At once, not after the 900 s drain (the bound leaves room for a loaded machine).
    assert time.monotonic() - signalled < 300
    assert "second signal, exiting at once" in worker.output()
    # Nothing was released: the job stays leased until its lease expires and is reclaimed.
    left = Job.objects.get(pk=job.pk)
    assert left.state == Job.State.RUNNING
    assert left.lease_owner == job.lease_owner
    assert left.attempts == 1


def test_sigint_stops_an_idle_worker_cleanly(start_worker):
    worker = start_worker()
    worker.wait_registered()
    worker.signal(signal.SIGINT)
    assert worker.wait(30) == 0
    assert not Worker.objects.live().exists()


def test_worker_row_lives_while_the_worker_runs_and_is_removed_on_exit(start_worker):
    worker = start_worker(
        "--worker-id",
        "probe-worker",
        "--concurrency",
        "3",
        "--queue",
        "alpha",
        "--queue",
        "beta",
        "--lease-ttl",
        "2",
        "--heartbeat-interval",
        "0.5",
    )
    row = worker.wait_registered()
    assert row.id == "probe-worker"
    assert row.pid == worker.pid
    assert row.host == socket.gethostname()
    assert row.concurrency == 3
    assert row.queues == ["alpha", "beta"]
    first_beat = row.heartbeat_at
    assert row.started_at <= first_beat
    # The heartbeat keeps the row fresh.
    poll(lambda: Worker.objects.get(pk="probe-worker").heartbeat_at > first_beat, timeout=30)
    # Its claims carry its id.
    job = jobqueue.enqueue("test.sleep", {"seconds": 0.5}, queue="beta")
    assert wait_for_job(job.pk, Job.State.RUNNING, Job.State.DONE).state in (
        Job.State.RUNNING,
        Job.State.DONE,
    )
    assert worker.stop() == 0
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE
    assert not Worker.objects.live().filter(pk="probe-worker").exists()
    assert_clean_log(worker.output())


def test_worker_whose_row_was_deleted_registers_again(start_worker):
    """A worker whose row vanished (swept as stale, deleted by an operator) registers again."""
    worker = start_worker("--lease-ttl", "2", "--heartbeat-interval", "0.5")
    row = worker.wait_registered()
    Worker.objects.all().delete()
    again = poll(worker.row, timeout=30)
    assert again.id == row.id
    assert worker.stop() == 0


def test_a_result_being_handed_over_at_the_deadline_is_recorded(start_worker, tmp_path):
    """--shutdown-timeout 0: a handler that has returned is not released, its result is kept.

    Fix: the drain released every attempt not settled yet, including one whose handler had
    returned and whose thread was checking the result; the job then ran a second time.
    """
    marker = tmp_path / "returning"
    worker = start_worker("--shutdown-timeout", "0", "--poll-interval", "0.05")
    worker.wait_registered()
    job = jobqueue.enqueue("test.slow_to_check", {"marker": str(marker)})
    # The marker is written as the worker begins to check the result, which takes a second
    # more: the handler has returned, and its outcome is not settled yet.
    poll(marker.exists, timeout=60, interval=0.002)
    assert worker.stop() == 0
    done = Job.objects.get(pk=job.pk)
    assert done.state == Job.State.DONE, worker.output()
    assert done.attempts == 1
    assert done.result == {"checked": True}
