"""Durable calls of async handlers with real worker processes: async steps survive a SIGKILL,
a plain function's write commits with its step's record (or is lost with it), sleeps and waits
give back the job's place under its limit, and nothing durable blocks the event loop."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import Job, JobStep
from tests.conftest import poll, wait_for_job
from tests.support.workflow_support import FAST, run_intervals
from tests.testapp.durable_jobs import lines
from tests.testapp.models import Order

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A short lease: a killed worker's jobs are reclaimed within seconds.
SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5", *FAST)
LIMITS = {"tenant:*": {"concurrency": 1}}
TENANT = {"tenant:7": 1}


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return str(tmp_path / "calls")


@pytest.fixture
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
    return {"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}


def test_a_worker_killed_in_the_third_async_step_runs_only_that_step_again(start_worker, marker):
    job = jobqueue.enqueue("adurable.three_steps", {"marker": marker, "hold": 60}, max_attempts=3)
    doomed = start_worker(*SHORT_LEASE)
    poll(lambda: lines(marker) == ["one", "two", "three"])
    doomed.kill()  # SIGKILL while the third step's coroutine waits
    start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert done.result == ["one-result", "two-result", "three-result"]
    assert done.attempts == 2
    assert lines(marker) == ["one", "two", "three", "three"]


def test_a_plain_functions_write_is_lost_with_its_steps_record_when_the_worker_dies(
    start_worker, marker
):
    """The worker is killed after the step's function wrote its row and before the record:
    both roll back together, and the retry's run of the step writes the row once."""
    job = jobqueue.enqueue(
        "adurable.writing_step", {"marker": marker, "number": "A-1", "hold": 60}, max_attempts=3
    )
    doomed = start_worker(*SHORT_LEASE)
    poll(lambda: lines(marker) == ["written"])
    doomed.kill()  # inside the step's transaction: the row is not committed
    assert not Order.objects.filter(number="A-1").exists()
    start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert lines(marker) == ["written", "written"]
    [order] = Order.objects.filter(number="A-1")
    assert done.result == order.pk
    assert list(JobStep.objects.filter(job=job).values_list("name", "result")) == [
        ("write", order.pk)
    ]


def test_an_async_jobs_last_progress_is_written_when_its_run_ends(start_worker):
    """Progress reported faster than it is written: the worker writes the last value when
    the run ends, as for a sync handler."""
    job = jobqueue.enqueue("adurable.progressing", {"steps": 30, "pause": 0.01})
    start_worker(*FAST)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert done.progress["current"] == 30
    assert done.progress["message"] == "page 30 of 30"


def held_nothing_while_another_ran(suspended: Job) -> None:
    """Another job of tenant 7 (limit 1) ran to its end while `suspended` held no lease."""
    other = jobqueue.enqueue("adurable.record", {"seconds": 0.2}, uses=TENANT, max_attempts=1)
    done = wait_for_job(other.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert len(run_intervals(pk=other.pk)) == 1
    row = Job.objects.get(pk=suspended.pk)
    assert row.state in (Job.State.SCHEDULED, Job.State.WAITING), row.state
    assert (row.lease_owner, row.attempts) == (None, 0)


def test_an_async_sleep_gives_back_the_tenants_place(start_worker, limits):
    # Long enough that the other runs while it sleeps, on a loaded machine too.
    sleeper = jobqueue.enqueue("adurable.sleeper", {"seconds": 12}, uses=TENANT, max_attempts=1)
    start_worker("--concurrency", "4", *FAST, env=limits)
    poll(lambda: Job.objects.get(pk=sleeper.pk).state == Job.State.SCHEDULED)
    held_nothing_while_another_ran(sleeper)
    done = wait_for_job(sleeper.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts) == (Job.State.DONE, 1), done.last_error
    assert done.result >= 12


def test_an_async_wait_for_an_event_gives_back_the_tenants_place(start_worker, limits):
    waiter = jobqueue.enqueue("adurable.waiter", {"key": "go"}, uses=TENANT, max_attempts=1)
    start_worker("--concurrency", "4", *FAST, env=limits)
    poll(lambda: Job.objects.get(pk=waiter.pk).state == Job.State.WAITING)
    held_nothing_while_another_ran(waiter)
    jobqueue.send_event("go", {"n": 7})
    done = wait_for_job(waiter.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 1, {"payload": {"n": 7}})


def test_an_async_wait_for_jobs_gives_back_the_tenants_place(start_worker, limits):
    # Its children wait for an event sent once the other has run: the parent still waits then.
    parent = jobqueue.enqueue(
        "adurable.spawn_and_wait",
        {"children": [["adurable.waiter", {"key": f"release-{n}"}] for n in range(2)]},
        uses=TENANT,
        max_attempts=1,
    )
    start_worker("--concurrency", "4", *FAST, env=limits)
    poll(lambda: Job.objects.get(pk=parent.pk).state == Job.State.WAITING)
    held_nothing_while_another_ran(parent)
    for n in range(2):
        jobqueue.send_event(f"release-{n}", n)
    done = wait_for_job(parent.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts) == (Job.State.DONE, 1), done.last_error
    assert sorted(result["payload"] for result in done.result.values()) == [0, 1]


def test_a_long_plain_function_in_a_step_does_not_block_the_loop(start_worker, marker):
    """While one async job's step runs a blocking function (off the loop, on its sync-call
    thread), the worker's other async jobs go on: three that started before it tick every
    0.1 s and finish while it blocks; where writers do not take turns (not SQLite, whose step
    holds the database's write lock), jobs enqueued meanwhile start and finish too."""
    slow = jobqueue.enqueue(
        "adurable.slow_sync_step", {"marker": marker, "seconds": 10, "after": 3}, max_attempts=1
    )
    tickers = [jobqueue.enqueue("adurable.ticker", {"marker": marker, "seconds": 2})
               for _ in range(3)]  # fmt: skip
    start_worker("--concurrency", "8", *FAST)
    poll(lambda: "in-step" in lines(marker))
    quick = []
    if get_dialect("default").has_select_for_update_skip_locked:
        quick = [jobqueue.enqueue("test.async_where") for _ in range(5)]
        for job in quick:
            done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
            assert done.state == Job.State.DONE, done.last_error
        assert "step-end" not in lines(marker), "the jobs enqueued waited for the step"
    done = wait_for_job(slow.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    step = done.result
    # Every ticker ended during the step, having ticked all along: no gap as long as the step.
    assert lines(marker)[-1] == "step-end"
    assert lines(marker).count("tick-end") == 3
    for job in tickers:
        ticks = wait_for_job(job.pk, Job.State.DONE, timeout=90).result["ticks"]
        assert step["started"] < ticks[-1] < step["finished"]
        assert max(b - a for a, b in itertools.pairwise(ticks)) < 5
    for job in quick:
        ran = Job.objects.get(pk=job.pk).result
        assert step["started"] < ran["started"] <= ran["finished"] < step["finished"]


def test_a_timeout_fails_an_async_job_whose_plain_step_runs_on_and_records_nothing(
    start_worker, marker
):
    """A plain function in a step is not interrupted by the job's timeout: the attempt fails
    with JobTimeout, and the step, ending after that, cannot record (its lease is gone).
    On SQLite the step's transaction holds the database's write lock: the failure is written
    once it ends, and the record, made while the lease was the attempt's, stays."""
    job = jobqueue.enqueue(
        "adurable.slow_sync_step", {"marker": marker, "seconds": 10}, timeout=1, max_attempts=1
    )
    start_worker(*FAST)
    dead = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert dead.state == Job.State.DEAD
    assert "timeout of 1" in dead.last_error["message"]
    if not get_dialect("default").has_select_for_update_skip_locked:
        assert lines(marker) == ["in-step", "step-end"]
        assert JobStep.objects.filter(job=job).count() == 1
        return
    assert "step-end" not in lines(marker)  # failed while the function still ran
    poll(lambda: "step-end" in lines(marker))
    time.sleep(1.0)  # the record's refused insert follows the function's end
    assert not JobStep.objects.filter(job=job).exists()
