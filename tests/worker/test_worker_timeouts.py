"""Per-job timeouts in a worker process: the attempt fails, the slot is freed, late results lost."""

from __future__ import annotations

import time

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = pytest.mark.django_db(transaction=True)

TERMINAL = (Job.State.DONE, Job.State.DEAD)
TIMEOUT_ERROR = "django_jobqueue.exceptions.JobTimeout"


def assert_timed_out(job: Job, timeout: float) -> None:
    assert job.state == Job.State.DEAD
    assert job.last_error["type"] == TIMEOUT_ERROR
    assert f"timeout of {timeout}s" in job.last_error["message"]
    assert job.result is None


def test_hung_sync_handler_times_out_and_frees_its_slot(start_worker):
    """With one slot, a job stuck in a C call (time.sleep) is failed at its timeout and the
    next job runs while the stuck thread is still asleep."""
    hung = jobqueue.enqueue("test.sleep", {"seconds": 600}, timeout=1, max_attempts=1, priority=9)
    after = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    worker = start_worker("--concurrency", "1")
    dead = wait_for_job(hung.pk, *TERMINAL)
    assert_timed_out(dead, 1.0)
    assert "thread abandoned" in dead.last_error["message"]
    done = wait_for_job(after.pk, *TERMINAL, timeout=120)
    assert done.state == Job.State.DONE
    assert done.result == 2
    # Claimed once the timeout freed the slot (its failure is recorded by the completer, which
    # may write a few milliseconds after the next claim).
    assert (done.started_at - dead.started_at).total_seconds() >= 0.9
    # The hung handler sleeps for ten minutes; the slot came back long before (the bound
    # leaves room for a loaded machine).
    assert (done.finished_at - dead.started_at).total_seconds() < 300
    assert worker.running()
    started = time.monotonic()
    assert worker.stop(timeout=300) == 0  # the abandoned thread does not hold up a clean exit
    assert time.monotonic() - started < 300
    assert_clean_log(worker.output())


@pytest.mark.slow
def test_late_result_of_a_timed_out_attempt_is_discarded(start_worker):
    """test.record writes a RunRecord and returns after its sleep; the timed-out attempt's
    late return must change neither the job nor leave a record."""
    job = jobqueue.enqueue(
        "test.record", {"sleep": 2, "value": "late"}, timeout=0.5, max_attempts=2
    )
    worker = start_worker("--concurrency", "1")
    dead = wait_for_job(job.pk, *TERMINAL)
    assert_timed_out(dead, 0.5)
    assert dead.attempts == 2  # the first timeout was retried like any failure
    before = Job.objects.filter(pk=job.pk).values().get()
    # Give both abandoned handlers time to come back from their 2 s sleep (a wait for an
    # absence: it cannot fail spuriously, at worst it proves less on a very slow machine).
    time.sleep(3)
    assert Job.objects.filter(pk=job.pk).values().get() == before
    assert not RunRecord.objects.filter(job_id=job.pk).exists()
    assert worker.stop() == 0
    assert "done in" not in worker.output()


def test_spinning_handler_is_interrupted_so_the_worker_keeps_going(start_worker):
    """A pure-Python loop gets JobTimeout raised inside it, so its thread ends; three of them
    do not count as hung threads (which would stop the worker)."""
    spinners = [
        jobqueue.enqueue("test.spin", {"seconds": 120}, timeout=0.5, max_attempts=1)
        for _ in range(3)
    ]
    worker = start_worker("--concurrency", "1")
    for job in spinners:
        assert_timed_out(wait_for_job(job.pk, *TERMINAL), 0.5)
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 2})
    assert wait_for_job(after.pk, *TERMINAL).result == 4
    assert worker.running()
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_worker_exits_for_a_restart_when_too_many_threads_stay_hung(start_worker):
    """Threads stuck in C calls cannot be interrupted; at JOBQUEUE['MAX_ABANDONED_THREADS']
    (3) of them the worker stops with status 3 so its supervisor restarts it."""
    stuck = [
        jobqueue.enqueue("test.sleep", {"seconds": 120}, timeout=0.5, max_attempts=1)
        for _ in range(3)
    ]
    worker = start_worker("--concurrency", "1")
    assert worker.wait(60) == 3
    for job in stuck:
        assert_timed_out(Job.objects.get(pk=job.pk), 0.5)
    assert "still stuck in their threads" in worker.output()
    assert not Worker.objects.live().exists()


def test_async_handler_times_out(start_worker):
    job = jobqueue.enqueue("test.async_sleep", {"seconds": 60}, timeout=0.5, max_attempts=1)
    worker = start_worker()
    assert_timed_out(wait_for_job(job.pk, *TERMINAL), 0.5)
    after = jobqueue.enqueue("test.async_add", {"a": 20, "b": 22})
    assert wait_for_job(after.pk, *TERMINAL).result == 42
    assert worker.stop() == 0
    assert_clean_log(worker.output())


@pytest.mark.parametrize(
    "handler, args",
    [("test.async_sleep", {"seconds": 60}), ("test.sleep", {"seconds": 0.2})],
    ids=["async-own-timeout", "sync-returns-at-the-deadline"],
)
def test_timeouts_racing_with_their_handlers_lose_no_other_job(start_worker, handler, args):
    """The worker times an attempt out just as its handler returns (a sync sleep as long as
    the timeout) or times itself out (an async handler's own wait_for). It must not raise
    JobTimeout into a thread that has already gone back for the next job: that job would be
    lost (leased, its lease renewed, never run)."""
    jobs = []
    for i in range(8):
        jobs.append(jobqueue.enqueue(handler, args, timeout=0.2, max_attempts=1))
        jobs.append(jobqueue.enqueue("test.add", {"a": i, "b": 0}))
    worker = start_worker("--concurrency", "1")
    for job in jobs:
        final = wait_for_job(job.pk, *TERMINAL, timeout=60)
        if final.type == "test.add":
            assert final.state == Job.State.DONE
        elif final.state == Job.State.DEAD:
            assert_timed_out(final, 0.2)
        else:
            assert final.result == 0.2  # the sync sleep made it in time
    assert worker.running()
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_async_handler_runs_to_completion(start_worker):
    jobs = [jobqueue.enqueue("test.async_add", {"a": i, "b": 1}, timeout=30) for i in range(4)]
    worker = start_worker("--concurrency", "2")
    for i, job in enumerate(jobs):
        done = wait_for_job(job.pk, *TERMINAL)
        assert done.state == Job.State.DONE, done.last_error
        assert done.result == i + 1
        assert done.attempts == 1
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_job_within_its_timeout_is_not_disturbed(start_worker):
    job = jobqueue.enqueue("test.record", {"sleep": 0.3, "value": "ok"}, timeout=20)
    worker = start_worker()
    done = wait_for_job(job.pk, *TERMINAL)
    assert done.state == Job.State.DONE
    assert done.result == "ok"
    assert done.last_error is None
    assert RunRecord.objects.filter(job_id=job.pk).count() == 1
    assert worker.stop() == 0
    poll(lambda: not Worker.objects.live().exists())
