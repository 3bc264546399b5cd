"""Async handlers run as tasks on the worker's one long-lived event loop.

No event loop is built per job and no handler thread waits on a coroutine: every async job of
a worker runs on the same loop, in its `jobqueue-loop` thread, so a client a handler keeps
serves later jobs; many run at once; a coroutine that blocks the loop is still timed out.
"""

from __future__ import annotations

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)

TERMINAL = (Job.State.DONE, Job.State.DEAD)


def test_async_jobs_share_one_event_loop_in_its_own_thread(start_worker):
    jobs = [jobqueue.enqueue("test.async_where") for _ in range(12)]
    worker = start_worker("--concurrency", "3")
    results = [wait_for_job(job.pk, *TERMINAL).result for job in jobs]
    assert {r["thread"] for r in results} == {"jobqueue-loop"}
    assert {r["loops"] for r in results} == {1}, "a job ran on an event loop of its own"
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_async_jobs_run_at_once_up_to_the_concurrency(start_worker):
    """20 jobs that each wait 5 s, at --concurrency 20: all are waiting at the same time."""
    jobs = [jobqueue.enqueue("test.async_where", {"seconds": 5}) for _ in range(20)]
    worker = start_worker("--concurrency", "20")
    results = [wait_for_job(job.pk, *TERMINAL, timeout=120).result for job in jobs]
    assert max(r["started"] for r in results) < min(r["finished"] for r in results)
    assert worker.stop() == 0


def test_a_coroutine_that_blocks_the_loop_is_timed_out_and_the_loop_goes_on(start_worker):
    """A sync sleep inside a coroutine stops asyncio's own timeout; the worker fails the
    attempt after its grace, and once the coroutine returns the loop runs the next jobs."""
    blocked = jobqueue.enqueue("test.async_block", {"seconds": 4}, timeout=0.5, max_attempts=1)
    worker = start_worker("--concurrency", "2")
    final = wait_for_job(blocked.pk, *TERMINAL)
    assert final.state == Job.State.DEAD
    assert "timeout of 0.5s" in final.last_error["message"]
    after = jobqueue.enqueue("test.async_add", {"a": 40, "b": 2})
    assert wait_for_job(after.pk, *TERMINAL).result == 42
    assert worker.running()
    assert worker.stop() == 0


def test_shutdown_releases_async_jobs_still_running_and_cancels_their_tasks(start_worker):
    job = jobqueue.enqueue("test.async_sleep", {"seconds": 600})
    worker = start_worker("--shutdown-timeout", "1")
    wait_for_job(job.pk, Job.State.RUNNING)
    assert worker.stop(timeout=60) == 0
    released = Job.objects.get(pk=job.pk)
    assert released.state == Job.State.READY
    assert "released 1 unfinished job(s)" in worker.output()


def test_a_loop_that_stays_blocked_makes_the_worker_exit_for_a_restart(start_worker):
    """A coroutine that blocks the loop for good stops every async job of the worker: each
    async attempt timed out meanwhile counts as a stuck thread, and at
    JOBQUEUE['MAX_ABANDONED_THREADS'] (3) the worker stops with status 3 for its supervisor
    to restart it, as with stuck sync threads."""
    stuck = [
        jobqueue.enqueue("test.async_block", {"seconds": 120}, timeout=0.5, max_attempts=1)
        for _ in range(3)
    ]
    worker = start_worker("--concurrency", "3")
    assert worker.wait(90) == 3
    for job in stuck:
        final = Job.objects.get(pk=job.pk)
        assert final.state == Job.State.DEAD
        assert "timeout of 0.5s" in final.last_error["message"]
    assert "still stuck in their threads" in worker.output()


def test_async_jobs_orm_calls_spread_over_the_sync_call_threads_one_job_to_a_thread(
    start_worker,
):
    """12 async jobs at once, each making a thread-sensitive (ORM) call before and after a
    wait: a job's calls stay on one thread, the jobs use more than one thread, and no more
    than SYNC_CALL_THREADS (4 by default) at --concurrency 12."""
    jobs = [jobqueue.enqueue("test.async_orm_threads", {"seconds": 3}) for _ in range(12)]
    worker = start_worker("--concurrency", "12")
    results = [wait_for_job(job.pk, *TERMINAL, timeout=120) for job in jobs]
    assert all(r.state == Job.State.DONE for r in results), [r.last_error for r in results]
    for r in results:
        assert r.result["before"] == r.result["after"]
        assert r.result["before"]["name"].startswith("jobqueue-async-sync")
    threads = {r.result["before"]["ident"] for r in results}
    assert 2 <= len(threads) <= 4
    assert worker.stop() == 0
