"""--concurrency is a cap: a worker process never runs more handlers at once, sync and async
together. Jobs claimed ahead of a free slot (prefetch) wait for one without starting, and their
timeout counts from their start, not from the wait."""

from __future__ import annotations

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_all(start_worker, specs: list[dict], concurrency: int) -> list[Job]:
    """Enqueue `specs` at once, run them on one worker (prefetch on, the default), and
    return their jobs once all are done."""
    with transaction.atomic():
        ids = [job.pk for job in jobqueue.enqueue_many(specs)]
    worker = start_worker("--concurrency", str(concurrency))
    done = Job.objects.filter(pk__in=ids, state=Job.State.DONE)
    poll(lambda: done.count() == len(ids), timeout=240, interval=0.2)
    assert worker.stop() == 0, worker.output()
    assert_clean_log(worker.output())
    return list(Job.objects.filter(pk__in=ids))


@pytest.mark.parametrize(("concurrency", "count"), [(32, 800), (128, 1500)])
def test_short_async_jobs_never_run_more_at_once_than_the_concurrency(
    start_worker, concurrency, count
):
    """Fix: prefetched async jobs started on the event loop as soon as a thread handed them
    over, so up to --concurrency plus the prefetch ran at once (39 seen at 32, 159 at 128)."""
    specs = [{"type": "test.count_running_async", "args": {"seconds": 0.01}}] * count
    jobs = run_all(start_worker, specs, concurrency)
    most = max(job.result for job in jobs)
    print(f"most handlers at once: {most} at --concurrency {concurrency}")
    assert most <= concurrency


def test_sync_and_async_handlers_share_the_cap(start_worker):
    """Fix: sync handlers held the threads, while async ones ran beside them on the loop."""
    specs = [
        {"type": f"test.count_running_{kind}", "args": {"seconds": 0.01}}
        for _ in range(200)
        for kind in ("sync", "async", "async")
    ]
    jobs = run_all(start_worker, specs, 4)
    most = max(job.result for job in jobs)
    print(f"most handlers at once: {most} at --concurrency 4")
    assert most <= 4


def test_a_prefetched_async_job_waits_for_a_slot_and_its_timeout_counts_from_its_start(
    start_worker,
):
    """Short jobs earn prefetch; then two long jobs take both slots and the short ones
    claimed with them wait longer than their own timeout (0.5 s) for a slot: each runs to
    its end, since its timeout starts with its handler."""
    warm = jobqueue.enqueue_many([("test.async_where", {})] * 100)
    worker = start_worker("--concurrency", "2")
    poll(lambda: Job.objects.filter(state=Job.State.DONE).count() == len(warm), timeout=120)
    with transaction.atomic():
        long = jobqueue.enqueue_many(
            [{"type": "test.async_where", "args": {"seconds": 1.5}, "priority": 1}] * 2
        )
        short = jobqueue.enqueue_many(
            [{"type": "test.async_where", "timeout": 0.5, "max_attempts": 1}] * 10
        )
    ids = [job.pk for job in long + short]
    done = Job.objects.filter(pk__in=ids, state__in=Job.TERMINAL_STATES)
    poll(lambda: done.count() == len(ids), timeout=120)
    assert worker.stop() == 0, worker.output()
    finished = Job.objects.filter(pk__in=[job.pk for job in short])
    assert {(job.state, job.attempts) for job in finished} == {(Job.State.DONE, 1)}
    # The path was taken: some short job was claimed with the long ones (prefetched), and
    # waited in the worker for longer than its timeout before its handler started.
    waits = [job.result["started"] - job.started_at.timestamp() for job in finished]
    print(f"waits of the short jobs: {sorted(round(w, 2) for w in waits)}")
    assert max(waits) > 0.5
